"""Where a running ``make dev`` stack can be found by other shells.

The embedded PostgreSQL listens on a port chosen at its first start, so a
``flask --app wsgi fleet …`` typed in a second shell cannot guess it. While
it runs, ``make dev`` keeps ``<data dir>/devstack.json`` (mode 0600: the
URLs may hold passwords) with the ``DATABASE_URL`` and ``REDIS_URL`` it
gives its processes, and removes the file when it stops. The configuration
falls back to the file only when ``DATABASE_URL`` is not set and the
file's PostgreSQL answers (:func:`app.config.stack_urls`, the reader, lives
with the configuration it feeds), so a file left behind by a stack that was
killed hard is ignored once its server is gone.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from app.config import STACK_STATE_FILE as STATE_FILE
from app.config import read_stack_state

__all__ = ["STATE_FILE", "remove", "write"]


def write(data_dir: str | os.PathLike, *, database_url: str, redis_url: str,
          secret_key_file: str | None = None, web_url: str | None = None) -> Path:
    """Record this process's stack (replacing a stale record)."""
    path = Path(data_dir) / STATE_FILE
    temporary = path.with_name(f".{STATE_FILE}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"pid": os.getpid(), "started_at": int(time.time()),
                   "database_url": database_url, "redis_url": redis_url,
                   "secret_key_file": secret_key_file, "web_url": web_url}, fh)
        fh.write("\n")
    os.replace(temporary, path)
    return path


def remove(data_dir: str | os.PathLike) -> None:
    """Remove the record if this process wrote it (a second stack that failed
    to start must not remove the record of the one that runs)."""
    path = Path(data_dir) / STATE_FILE
    state = read_stack_state(path)
    if state is not None and state.get("pid") == os.getpid():
        path.unlink(missing_ok=True)
