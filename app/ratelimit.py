"""The fixed-window rate limiter shared by sign-in (the pages) and enrollment
(the API).

Rate limiting is a counter per key in PostgreSQL (``rate_limits``), bumped by
one ``INSERT … ON CONFLICT DO UPDATE`` in its own short transaction. Why not
in-process: gunicorn runs several workers (and maybe several hosts), each of
which would count separately, multiplying the limit and forgetting it at
every restart. The price is one round trip per login or enrollment attempt,
which are rare and already talk to the database. Fixed windows (aligned to
multiples of ``per_seconds``) are crude: a burst straddling a boundary gets
up to twice the limit, which is fine for slowing down guessing.
"""
from __future__ import annotations

import math
import random

from flask import current_app, request
from sqlalchemy import text

from app.errors import TooManyAttempts
from app.extensions import db

__all__ = ["TooManyAttempts", "client_key", "limit_enrollment", "limit_login", "rate_limit"]

# Keys are built from client addresses and scope names; bound them so a
# hostile header cannot grow the table's keys without limit.
MAX_KEY_CHARS = 200


_BUMP = text("""
INSERT INTO rate_limits AS r (key, window_end, hits)
VALUES (:k, to_timestamp((floor(extract(epoch FROM now()) / :per) + 1) * :per), 1)
ON CONFLICT (key) DO UPDATE SET
    hits = CASE WHEN r.window_end = EXCLUDED.window_end THEN r.hits + 1 ELSE 1 END,
    window_end = EXCLUDED.window_end
RETURNING hits, extract(epoch FROM window_end - now())
""")


def rate_limit(key: str, limit: int, per_seconds: int) -> None:
    """Count one hit for ``key``; at most ``limit`` hits per ``per_seconds`` window.

    The count commits on its own connection, so attempts that fail later
    in the request still count.

    Raises:
        TooManyAttempts: over the limit; ``retry_after_ms`` is the time left
            in the window. Pages answer 429 with ``Retry-After``; under
            ``/api/`` the error envelope does (code ``rate_limited``).
    """
    if limit < 1 or per_seconds < 1:
        raise ValueError("limit and per_seconds must be at least 1")
    with db.engine.begin() as conn:
        hits, left_s = conn.execute(_BUMP, {"k": key[:MAX_KEY_CHARS], "per": int(per_seconds)}).one()
        # Expired windows of keys never seen again would pile up; a cheap
        # sweep now and then keeps the table at the size of recent traffic.
        if random.random() < 0.01:
            conn.execute(text("DELETE FROM rate_limits WHERE window_end < now()"))
    if hits > limit:
        raise TooManyAttempts("too many attempts, try again later",
                              details={"limit": limit, "per_seconds": per_seconds},
                              retry_after_ms=max(1000, math.ceil(float(left_s) * 1000)))


def client_key(scope: str) -> str:
    """``scope:remote address``. Behind a reverse proxy the address is the
    proxy's unless the deployment applies ProxyFix (docs/pages.md)."""
    return f"{scope}:{request.remote_addr or '-'}"


def limit_login() -> None:
    """The limit shared by every sign-in entry point (per client address)."""
    cfg = current_app.config
    rate_limit(client_key("login"), int(cfg.get("LOGIN_RATE_LIMIT", 20)),
               int(cfg.get("LOGIN_RATE_WINDOW_S", 60)))


def limit_enrollment() -> None:
    """For ``POST /api/v1/fleet/register`` (per client address): call it first
    thing in the view; the API's error envelope answers 429."""
    cfg = current_app.config
    rate_limit(client_key("enroll"), int(cfg.get("ENROLL_RATE_LIMIT", 10)),
               int(cfg.get("ENROLL_RATE_WINDOW_S", 60)))
