"""Run a child program under a wall-clock limit and a memory limit on its whole process tree.

OCRmyPDF forks a pool of worker processes, and each runs Tesseract as a
further child, so a limit on one process limits nothing: ``RLIMIT_AS`` set
before ``exec`` applies to each process separately (and counts address space
that threads and arenas reserve but never touch, so it refuses harmless
runs). The two tree-wide options are a cgroup (``memory.max``) and a
sampling watchdog. A cgroup needs write access to the cgroup tree (root, or a
systemd-delegated subtree) that an unprivileged container or a plain user
account does not have, so this module samples instead, which works wherever
``/proc`` does:

- the child starts in a session of its own (``setsid``); every process it
  forks stays in that session unless it calls ``setsid`` itself, which
  OCRmyPDF, its pool and Tesseract do not — even when the parent dies and
  they are re-parented to init;
- every ``SAMPLE_SECONDS`` the watchdog sums the proportional set size (PSS:
  each shared page split between the processes sharing it, so the forked
  pool's shared interpreter pages are not counted once per worker) over the
  session's live processes, and compares it with the limit;
- over the limit, past the deadline or when the caller cancels, every process in the session is sent
  SIGKILL (the process group, then each member by pid) until none is left.

The limit can be overshot for up to one sampling period; a child that
allocates faster than that meets the kernel's OOM killer instead, which the
engine reports as a retryable crash.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import BrokenWorker

SAMPLE_SECONDS = 0.1
KILL_WAIT_SECONDS = 10.0
_PAGE = os.sysconf("SC_PAGE_SIZE")
_NICE_THEN_EXEC = "import os, sys; os.nice(int(sys.argv[1])); os.execvp(sys.argv[2], sys.argv[2:])"


@dataclass(frozen=True)
class ChildOutcome:
    returncode: int | None      # None when the watchdog killed the child
    killed: str | None          # "time_limit" | "memory_limit" | "cancelled" | None
    seconds: float
    peak_memory_bytes: int      # highest summed PSS seen over the tree
    log_path: Path              # the command line, then the child's stdout and stderr, interleaved

    def log_tail(self, limit: int = 16384) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(max(0, self.log_path.stat().st_size - limit))
            return log.read().decode("utf-8", "replace")


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``sid``."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone while we looked
            continue
        # After the command name: state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def process_memory(pid: int) -> int:
    """PSS of one process in bytes (RSS where smaps_rollup is unavailable); 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session and wait until none is left."""
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while True:
        members = session_members(sid)
        if not members:
            return
        try:
            os.killpg(sid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in members:  # a member that moved to another process group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            # Stuck in the kernel (a hung disk): they may hold memory and files,
            # so this worker should not take more work.
            raise BrokenWorker("unkillable", f"processes {members} of an OCR run survived SIGKILL "
                                             f"for {KILL_WAIT_SECONDS:.0f} s")
        time.sleep(0.02)


def run_limited(argv: list[str], *, log_path: Path, env: dict[str, str], cwd: Path,
                time_limit_s: float, memory_limit_bytes: int, nice: int = 0,
                cancel: threading.Event | None = None) -> ChildOutcome:
    """Run ``argv`` to its end, until a limit is hit or ``cancel`` is set; no process of its tree outlives this call."""
    started = time.monotonic()
    deadline = started + time_limit_s
    peak = 0
    killed = None
    command = "$ " + shlex.join(argv) + "\n"
    if nice:
        # The child lowers its own priority before exec'ing the program, so
        # every process it forks inherits it (a setpriority() from here would
        # race with the child's first fork). No `nice` binary needed on PATH.
        argv = [sys.executable, "-c", _NICE_THEN_EXEC, str(nice), *argv]
    with open(log_path, "wb") as log:
        # The command first: the log alone then tells what ran.
        log.write(command.encode())
        log.flush()
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=env, cwd=cwd, start_new_session=True)
    try:
        while True:
            try:
                child.wait(timeout=SAMPLE_SECONDS)
                break
            except subprocess.TimeoutExpired:
                pass
            used = sum(process_memory(pid) for pid in session_members(child.pid))
            peak = max(peak, used)
            if used > memory_limit_bytes:
                killed = "memory_limit"
                break
            if time.monotonic() > deadline:
                killed = "time_limit"
                break
            if cancel is not None and cancel.is_set():
                killed = "cancelled"
                break
    finally:
        # Also after a normal exit: a helper the child left behind would keep
        # running (and using memory) outside every limit.
        kill_session(child.pid)
        child.wait()
    return ChildOutcome(returncode=None if killed else child.returncode, killed=killed,
                        seconds=time.monotonic() - started, peak_memory_bytes=peak,
                        log_path=log_path)
