"""The master's memory at rest, as the Procfile runs it, against the shape it
replaced, in the same run.

Starts the Procfile's ``web`` and ``tasks`` lines (the clock a thread of
tasks) on a fresh database, waits for ``/readyz``, lets them rest, and reads
the PSS of each process tree (a page shared between processes counted in
part by each); then does the same for the earlier shape: ``tasks`` with
dramatiq's default of a process per core and a ``python -m tasks.clock``
process of its own.

Last line: ``shape_memory procfile_mb=… web_mb=… tasks_mb=…
apart_clock_shape_mb=… clock_mb=…``.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

import redis

from _common import ROOT, free_port, fresh_database, pss_mb, stop, wait_ready

REDIS_URL = os.environ.get("FLEETHQ_BENCH_REDIS", "redis://127.0.0.1:6379/13")
BIN = os.path.dirname(sys.executable)


def procfile() -> dict[str, list[str]]:
    with open(os.path.join(ROOT, "Procfile"), encoding="utf-8") as fh:
        return {name.strip(): shlex.split(command) for name, _, command in
                (line.partition(":") for line in fh if line.strip() and not line.startswith("#"))}


def measure(shape: dict[str, list[str]], db_url: str, rest_s: float, directory: str) -> dict[str, float]:
    """Start ``shape`` (name -> argv), let it rest, return the PSS of each in MB."""
    redis.Redis.from_url(REDIS_URL).flushdb()
    port = free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "REDIS_URL": REDIS_URL, "FLEETHQ_SECRET_KEY": "bench",
           "FLEETHQ_DATA_DIR": directory, "FLEETHQ_BIND": f"127.0.0.1:{port}",
           "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    procs = {name: subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                    stderr=open(os.path.join(directory, f"{name}.log"), "wb"))
             for name, argv in shape.items()}
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", procs["web"])
        time.sleep(rest_s)
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: see {directory}/{name}.log")
        return {name: pss_mb(proc.pid) for name, proc in procs.items()}
    finally:
        stop(*procs.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rest", type=float, default=20.0, help="seconds at rest before reading")
    parser.add_argument("--dir", default=os.path.join(ROOT, "var", "bench-shape-memory"))
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    db_url = fresh_database("bench_shape_memory")
    lines = procfile()
    ours = measure({"web": lines["web"], "tasks": lines["tasks"]}, db_url, args.rest, args.dir)
    before = measure({"web": lines["web"], "tasks": ["dramatiq", "tasks:setup_broker"],
                      "clock": ["python", "-m", "tasks.clock"]}, db_url, args.rest, args.dir)
    for name, shape in (("procfile", ours), ("apart clock", before)):
        print(f"{name:12} " + " ".join(f"{k}={v:.0f} MB" for k, v in shape.items()), file=sys.stderr)
    print(f"shape_memory procfile_mb={sum(ours.values()):.0f} web_mb={ours['web']:.0f} "
          f"tasks_mb={ours['tasks']:.0f} apart_clock_shape_mb={sum(before.values()):.0f} "
          f"clock_mb={before['clock']:.0f}")


if __name__ == "__main__":
    main()
