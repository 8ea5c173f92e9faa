"""Configuration: one class of defaults, overridden from the environment.

``FLEETHQ_<NAME>`` sets any key below (values of numeric, boolean and list
settings are parsed as JSON; text settings are taken as given); ``DATABASE_URL`` and ``REDIS_URL`` keep their usual names.
When ``DATABASE_URL`` is set nowhere, a running ``make dev`` stack found in
the data directory supplies both (:mod:`app.devstate`).
"""
from __future__ import annotations

import json
import os

from workers.private_file import OpenToOthers, read_private


class Defaults:
    SECRET_KEY = None
    # A file holding the key instead (``flask fleet web-keygen --out FILE``
    # writes one); it must not be readable by group or others.
    SECRET_KEY_FILE = None
    # Keep a sealed copy of each user machine token (key derived from
    # SECRET_KEY) so that its admin and owner can view it again; false keeps
    # digests only.
    MACHINE_TOKENS_VIEWABLE = True
    DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/fleethq"
    REDIS_URL = "redis://127.0.0.1:6379/0"
    DATA_DIR = "var"
    # Body limits of DESIGN §6.
    WORKER_BODY_LIMIT = 64 * 1024      # fleet control bodies (DESIGN §7)
    API_BODY_LIMIT = 8 * 1024 * 1024   # JSON bodies of the SavewebHQ operations, as SavewebHQ's
    ENQUEUE_BODY_LIMIT = 8 * 1024 * 1024
    # Source imports (§4.4).
    SOURCE_MAX_COMPRESSED = 256 * 1024 * 1024
    SOURCE_MAX_EXPANDED = 4 * 1024**3
    SOURCE_MAX_JOBS = 10_000_000
    SOURCE_MAX_LINE = 64 * 1024
    SOURCE_MAX_WINDOW = 64 * 1024 * 1024
    SOURCE_BATCH = 20_000
    # Lazy lease reaping done inside a claim, per request.
    CLAIM_REAP_LIMIT = 64
    # Per-worker claim audit rows of paced projects (SavewebHQ's claim buckets).
    CLAIM_BUCKET_RETENTION_DAYS = 30
    LONG_POLL_MAX_MS = 30_000
    # Refresh hint sent with the project policy.
    POLICY_REFRESH_MS = 60_000
    # Spool and uploads (DESIGN §8, §12).
    SPOOL_MAX_BYTES = 2 * 1024**3
    # Where verified uploads wait for the archive: "local" (SPOOL_DIR, shared
    # by web and tasks) or "s3" (a staging prefix in the S3 store; no shared disk).
    SPOOL_BACKEND = "local"
    UPLOAD_MIN_BYTES = 10 * 1024
    UPLOAD_MAX_BYTES = 100 * 1024 * 1024
    STAGED_RETENTION_S = 7 * 24 * 3600
    # Retention of finished rows (docs/operations.md "Retention"), pruned by
    # the clock in batches of at most PRUNE_BATCH rows per kind and tick.
    # 0 keeps that kind forever.
    KEEP_ATTEMPTS_PER_JOB = 20         # finished attempts kept per job, newest first
    KEEP_DONE_OUTBOX_DAYS = 14         # done outbox rows, delivered/skipped hook deliveries
    KEEP_FINISHED_JOBS_DAYS = 0        # done/failed/reset_exhausted jobs; an archive keeps them
    KEEP_AUDIT_DAYS = 365              # audit log rows
    PRUNE_BATCH = 5_000
    NODE_LEASE_S = 60
    WORKER_STALE_S = 90
    # GitHub sign-in (DESIGN §10). The URLs are settings so that tests (and
    # GitHub Enterprise) can point them elsewhere.
    GITHUB_CLIENT_ID = None
    GITHUB_CLIENT_SECRET = None
    # The callback registered with the GitHub OAuth App; SavewebHQ's apps use
    # /auth/github/callback, which is served too.
    GITHUB_CALLBACK_PATH = "/login/github/callback"
    GITHUB_ORG = None
    GITHUB_ADMIN_TEAM = None
    GITHUB_AUTHORIZE_URL = "https://github.com/login/oauth/authorize"
    GITHUB_TOKEN_URL = "https://github.com/login/oauth/access_token"
    GITHUB_API_URL = "https://api.github.com"
    SESSION_LIFETIME_S = 12 * 3600
    PUBLIC_URL = None
    DEV_MODE = False
    LOG_JSON = True
    SQLALCHEMY_ENGINE_OPTIONS = {"pool_size": 10, "max_overflow": 20,
                                 "connect_args": {"application_name": "fleethq-web"}}
    # Who carries the outbox's after-commit hints: "dramatiq" (the tasks
    # process, through Redis) or "recording" (kept in memory; tests).
    OUTBOX_SENDER = "dramatiq"
    # The tasks broker in memory instead of on REDIS_URL (tests).
    STUB_BROKER = False
    # Worker traffic has its own pool (DESIGN §12: 16..64, default 20).
    FLEET_POOL_SIZE = 20
    # "transaction" when DATABASE_URL is a transaction-mode pooler (PgBouncer):
    # no server-side prepared statements, and DIRECT_DATABASE_URL required for
    # what must keep one server session (LISTEN, the clock's advisory lock).
    DATABASE_POOLER = "none"
    # The database itself, bypassing any pooler; defaults to DATABASE_URL.
    DIRECT_DATABASE_URL = None


def _coerce(key: str, raw: str):
    """Settings whose default is a string or unset (keys, paths, URLs, ids)
    take the text as given, so an all-digit secret stays a string; the others
    are read as JSON (numbers, booleans, lists)."""
    if key in _TEXT_SETTINGS:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


_TEXT_SETTINGS = frozenset(k for k, v in vars(Defaults).items() if k.isupper() and (v is None or isinstance(v, str)))


def load(overrides: dict | None = None) -> dict:
    cfg = {k: v for k, v in vars(Defaults).items() if k.isupper()}
    for key, raw in os.environ.items():
        if key.startswith("FLEETHQ_"):
            cfg[key[len("FLEETHQ_"):]] = _coerce(key[len("FLEETHQ_"):], raw)
    for key in ("DATABASE_URL", "REDIS_URL"):
        if os.environ.get(key):
            cfg[key] = os.environ[key]
    # Plain S3_* switches the object store to S3 (DESIGN §2); strings as given.
    for key, raw in os.environ.items():
        if key.startswith("S3_") and raw:
            cfg[key] = raw
    overrides = overrides or {}
    cfg.update(overrides)
    if not ("DATABASE_URL" in overrides or os.environ.get("DATABASE_URL")
            or os.environ.get("FLEETHQ_DATABASE_URL")):
        from app import devstate
        found = devstate.live_urls(cfg["DATA_DIR"])
        if "REDIS_URL" in overrides or os.environ.get("REDIS_URL") or os.environ.get("FLEETHQ_REDIS_URL"):
            found.pop("REDIS_URL", None)
        if cfg.get("SECRET_KEY") or cfg.get("SECRET_KEY_FILE"):
            found.pop("SECRET_KEY_FILE", None)
        cfg.update(found)
    if os.environ.get("FLEETHQ_SECRET_KEY") and os.environ.get("FLEETHQ_SECRET_KEY_FILE"):
        raise ValueError("set FLEETHQ_SECRET_KEY or FLEETHQ_SECRET_KEY_FILE, not both")
    if cfg.get("SECRET_KEY_FILE") and not cfg.get("SECRET_KEY"):  # a key given to create_app wins
        cfg["SECRET_KEY"] = read_secret_file(cfg["SECRET_KEY_FILE"])
    cfg["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(cfg["DATABASE_URL"])
    if not isinstance(cfg["MACHINE_TOKENS_VIEWABLE"], bool):
        raise ValueError("MACHINE_TOKENS_VIEWABLE must be true or false, "
                         f"not {cfg['MACHINE_TOKENS_VIEWABLE']!r}")
    if cfg["OUTBOX_SENDER"] not in OUTBOX_SENDERS:
        raise ValueError(f"OUTBOX_SENDER must be one of {', '.join(OUTBOX_SENDERS)}, "
                         f"not {cfg['OUTBOX_SENDER']!r}")
    size = _bounded_int(cfg, "FLEET_POOL_SIZE", 16, 64)
    for key, low, high in RETENTION_BOUNDS:
        _bounded_int(cfg, key, low, high)
    session_args = _pooler_connect_args(cfg)
    if cfg["SPOOL_BACKEND"] not in ("local", "s3"):
        raise ValueError(f"SPOOL_BACKEND must be local or s3, not {cfg['SPOOL_BACKEND']!r}")
    if cfg["SPOOL_BACKEND"] == "s3" and not cfg.get("S3_BUCKET"):
        raise ValueError("SPOOL_BACKEND=s3 stages uploads in the object store: set S3_BUCKET")
    cfg["SQLALCHEMY_ENGINE_OPTIONS"] = {
        **cfg["SQLALCHEMY_ENGINE_OPTIONS"],
        "connect_args": {**cfg["SQLALCHEMY_ENGINE_OPTIONS"].get("connect_args", {}), **session_args}}
    cfg["SQLALCHEMY_BINDS"] = {"fleet": {
        "url": cfg["SQLALCHEMY_DATABASE_URI"], "pool_size": size, "max_overflow": 0,
        "connect_args": {"application_name": "fleethq-fleet", **session_args}}}
    cfg["LISTEN_DSN"] = libpq_url(sqlalchemy_url(cfg["DIRECT_DATABASE_URL"] or cfg["DATABASE_URL"]))
    return cfg


OUTBOX_SENDERS = ("dramatiq", "recording")
DATABASE_POOLERS = ("none", "transaction")


def _pooler_connect_args(cfg: dict) -> dict:
    """psycopg arguments for the pooled engines. Behind a transaction-mode
    pooler one client's transactions land on different server sessions, so a
    statement prepared in one would be missing (or already taken) in the next:
    psycopg must never prepare (``prepare_threshold=None``)."""
    pooler = cfg["DATABASE_POOLER"]
    if pooler not in DATABASE_POOLERS:
        raise ValueError(f"DATABASE_POOLER must be one of {', '.join(DATABASE_POOLERS)}, "
                         f"not {pooler!r}")
    if pooler == "none":
        return {}
    if not cfg["DIRECT_DATABASE_URL"]:
        raise ValueError("DATABASE_POOLER=transaction needs DIRECT_DATABASE_URL: LISTEN/NOTIFY "
                         "and the clock's lease hold one server session, which a "
                         "transaction-mode pooler cannot give")
    return {"prepare_threshold": None}

# (setting, lowest, highest); 0 disables a KEEP_* kind.
RETENTION_BOUNDS = (
    ("KEEP_ATTEMPTS_PER_JOB", 0, 1_000_000),
    ("KEEP_DONE_OUTBOX_DAYS", 0, 100_000),
    ("KEEP_FINISHED_JOBS_DAYS", 0, 100_000),
    ("KEEP_AUDIT_DAYS", 0, 100_000),
    ("PRUNE_BATCH", 1, 100_000),
)


def _bounded_int(cfg: dict, key: str, low: int, high: int) -> int:
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer {low}..{high}, not {value!r}")
    return value


def read_secret_file(path: str) -> str:
    """A secret kept in a private file: refused when group or others may read it."""
    try:
        value = read_private(path, 2048).decode("utf-8").strip()
    except OpenToOthers:
        raise ValueError(f"secret file {path} must not allow group or other access (chmod 600)") from None
    except OSError as exc:
        raise ValueError(f"cannot read secret file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"secret file {path} is not UTF-8 text") from None
    if not value or len(value) > 1024:
        raise ValueError(f"secret file {path} must hold 1..1024 characters")
    return value


def sqlalchemy_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and pin the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def libpq_url(url: str) -> str:
    """The same URL in the form psycopg itself understands."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)
