"""Where a running ``make dev`` stack can be found by other shells.

The embedded PostgreSQL listens on a port chosen at its first start, so a
``flask --app wsgi fleet …`` typed in a second shell cannot guess it. While
it runs, ``make dev`` keeps ``<data dir>/devstack.json`` (mode 0600: the
URLs may hold passwords) with the ``DATABASE_URL`` and ``REDIS_URL`` it
gives its processes, and removes the file when it stops. The configuration
falls back to the file only when ``DATABASE_URL`` is not set and the
file's PostgreSQL answers (:func:`live_urls`), so a file left behind by a
stack that was killed hard is ignored once its server is gone.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["STATE_FILE", "live_urls", "remove", "web_url", "write"]

STATE_FILE = "devstack.json"
_PROBE_TIMEOUT_S = 0.5


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
    state = _read(path)
    if state is not None and state.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def live_urls(data_dir: str | os.PathLike) -> dict[str, str]:
    """``{"DATABASE_URL": …[, "REDIS_URL": …][, "SECRET_KEY_FILE": …]}`` of a
    stack whose PostgreSQL answers, else ``{}``. Redis is included only when
    it answers too; the key file when the stack made its own key."""
    state = _read(Path(data_dir) / STATE_FILE)
    if not state or not isinstance(state.get("database_url"), str):
        return {}
    if not _answers(state["database_url"], default_port=5432):
        return {}
    found = {"DATABASE_URL": state["database_url"]}
    if isinstance(state.get("secret_key_file"), str):
        found["SECRET_KEY_FILE"] = state["secret_key_file"]
    redis_url = state.get("redis_url")
    if isinstance(redis_url, str) and _answers(redis_url, default_port=6379):
        found["REDIS_URL"] = redis_url
    return found


def web_url(data_dir: str | os.PathLike) -> str | None:
    """The web address of a live ``make dev`` stack in ``data_dir`` (its
    FLEETHQ_PORT, not always 8400), or None."""
    state = _read(Path(data_dir) / STATE_FILE)
    url = state.get("web_url") if state else None
    if not isinstance(url, str) or not _answers(url, default_port=80):
        return None
    return url


def _read(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _answers(url: str, *, default_port: int) -> bool:
    """Whether something accepts a connection where ``url`` points (TCP, or a
    ``unix://`` socket path)."""
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(_PROBE_TIMEOUT_S)
                sock.connect(parts.path)
            return True
        host = parts.hostname or "127.0.0.1"
        with socket.create_connection((host, parts.port or default_port), timeout=_PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False
