"""``fleethq-worker``: the worker program's command line.

    fleethq-worker run --master https://hq.example.org --volume /data \\
        [--enroll fhqe_…] --project papers [--concurrency 2] [--allow-http]
    fleethq-worker status --volume /data

Every ``run`` flag has a FLEETHQ_* environment twin (settings.py). Exit codes
are in workers/runner/__init__.py and docs/worker.md.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from workers import logs
from workers.runner import (EXIT_CORRUPT, EXIT_ENROLL, EXIT_ERROR, EXIT_LOCKED, EXIT_OK,
                            EXIT_REVOKED, EXIT_USAGE)
from workers.runner.enroll import EnrollError, ensure_registered, wait_until_approved
from workers.runner.journal import Journal
from workers.runner.master import Master, Refused
from workers.runner.recovery import recover
from workers.runner.settings import add_arguments, resolve
from workers.runner.volume import Volume, VolumeCorrupt, VolumeError, VolumeLocked

log = logging.getLogger("fleethq.worker")
STOP_GRACE_S = 10.0


def _fatal(code: int, text: str) -> int:
    log.error("%s", text)
    return code


def _install_signals(stop: threading.Event) -> None:
    def on_signal(signum, _frame):
        log.info("%s received: stopping", signal.Signals(signum).name)
        # Event.set() from a handler could deadlock with a wait() interrupted
        # inside the event's own lock; a short thread sets it instead.
        threading.Thread(target=stop.set, daemon=True).start()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def cmd_run(args) -> int:
    try:
        settings = resolve(args)
        master = Master(settings.master, client_version=settings.client_version,
                        allow_http=settings.allow_http,
                        proxy=os.environ.get("FLEETHQ_MASTER_PROXY") or None)
    except ValueError as exc:
        return _fatal(EXIT_USAGE, f"configuration: {exc}")
    stop = threading.Event()
    _install_signals(stop)
    volume = Volume(settings.volume)
    try:
        volume.open()
        identity = ensure_registered(volume, master, name=settings.name,
                                     credential=settings.enroll, stop=stop)
        master.secret = identity.secret
        journal = Journal.load(volume.journal_path, identity.worker_id)
        counts = recover(volume, journal)
        log.info("fleethq-worker %s: worker %s, volume %s, projects %s, concurrency %d; journal %s",
                 settings.client_version, identity.worker_id, volume.root,
                 ",".join(settings.projects), settings.concurrency, counts or "empty")
        status = wait_until_approved(master, poll_s=min(settings.heartbeat_s, 10.0), stop=stop)
        log.info("node is %s", status)

        from workers.runner.runner import Runner  # imports the fetch ladder
        runner = Runner(settings, volume, journal, master, identity.worker_id)
        runner.stop = stop
        runner.status = status
        runner.run()
        if runner.refused is not None:
            raise runner.refused
        runner.drain_fetches(STOP_GRACE_S)
        runner.sign_off()
        log.info("stopped; %d ready file(s) stay on the volume for the next start",
                 len(journal.entries("ready", "uploaded")))
        return EXIT_OK
    except VolumeLocked as exc:
        return _fatal(EXIT_LOCKED, str(exc))
    except VolumeCorrupt as exc:
        return _fatal(EXIT_CORRUPT, f"volume check failed: {exc}")
    except VolumeError as exc:
        return _fatal(EXIT_ERROR, str(exc))
    except EnrollError as exc:
        return _fatal(EXIT_ENROLL, str(exc))
    except Refused as exc:
        kept = sum(1 for p in volume.ready.iterdir()) if volume.ready.is_dir() else 0
        return _fatal(EXIT_REVOKED, f"the master refuses this worker's secret ({exc.message}): "
                      f"it was revoked or rejected. {kept} ready file(s) are kept in "
                      f"{volume.ready} for investigation; a new start needs a fresh volume "
                      "and a new enrollment credential")
    except InterruptedError:
        return EXIT_OK
    finally:
        volume.close()


def cmd_status(args) -> int:
    """What the volume holds, without taking its lock (read-only)."""
    raw = args.volume or os.environ.get("FLEETHQ_VOLUME", "")
    if not raw:
        return _fatal(EXIT_USAGE, "--volume (or FLEETHQ_VOLUME) is required")
    volume = Volume(Path(raw))
    try:
        identity = volume.load_identity()
        journal = Journal.load(volume.journal_path, identity.worker_id) if identity else None
    except VolumeCorrupt as exc:
        return _fatal(EXIT_CORRUPT, str(exc))
    entries = journal.entries() if journal else []
    by_state: dict[str, int] = {}
    for entry in entries:
        by_state[entry["state"]] = by_state.get(entry["state"], 0) + 1
    print(json.dumps({
        "worker_id": identity.worker_id if identity else None,
        "registered": identity.registered if identity else False,
        "journal": by_state,
        "ready_bytes": sum(e.get("size") or 0 for e in entries if e["state"] in ("ready", "uploaded")),
    }, indent=1))
    return EXIT_OK


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fleethq-worker", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="enroll (first start), then claim, fetch and deliver")
    add_arguments(run)
    run.add_argument("--log-level", default=None, help="default FLEETHQ_LOG_LEVEL, else INFO")
    status = sub.add_parser("status", help="show the volume's identity and journal")
    status.add_argument("--volume", default=None)
    status.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logs.configure("worker",
                   level=getattr(logging, str(args.log_level).upper(), logging.INFO) if args.log_level else None)
    if args.command != "run":
        return cmd_status(args)
    try:
        code = cmd_run(args)
    except Exception:
        log.exception("unexpected error")
        code = EXIT_ERROR
    # Exit without interpreter finalization: fetch threads parked inside
    # Playwright's greenlets or native code can crash Python's teardown
    # (seen as SIGSEGV at exit). The journal and volume are already closed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
