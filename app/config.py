"""Configuration: one class of defaults, overridden from the environment.

``FLEETHQ_<NAME>`` sets any key below (values of numeric, boolean and list
settings are parsed as JSON; text settings are taken as given);
``DATABASE_URL`` and ``REDIS_URL`` keep their usual names.
When ``DATABASE_URL`` is set nowhere, a running ``make dev`` stack found in
the data directory supplies both (:func:`stack_urls`).
"""
from __future__ import annotations

import contextlib
import json
import ipaddress
import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from workers.wire.private_file import OpenToOthers, read_private


class ConfigError(ValueError):
    """A setting that cannot work. Entry points report it in one line
    (``reported``) rather than as a traceback."""


@contextlib.contextmanager
def reported():
    """Around a process's first ``load()``: a bad setting ends the process
    with one line on standard error and exit status 2."""
    try:
        yield
    except ConfigError as exc:
        print(f"fleethq: bad setting: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


class Defaults:
    # Each setting has its own comment: docs/configuration.md and
    # .env.example are generated from them (python -m app.dev.config_reference).

    # The key sessions, CSRF tokens, signed links, sealed machine tokens and
    # sealed hook secrets rest on; unset, each process makes one of its own
    # (fine for a demo only).
    SECRET_KEY = None
    # A file holding the key instead (``flask fleet web-keygen --out FILE``
    # writes one); it must not be readable by group or others.
    SECRET_KEY_FILE = None
    # Keep a sealed copy of each user machine token (key derived from
    # SECRET_KEY) so that its admin and owner can view it again; false keeps
    # digests only.
    MACHINE_TOKENS_VIEWABLE = True
    # What new user machine tokens start with. An installation switched from
    # SavewebHQ may keep issuing its "hq_" tokens (its scripts check for it);
    # tokens already issued work whatever they start with.
    MACHINE_TOKEN_PREFIX = "fhq_"
    # PostgreSQL, the one source of truth (a pooler's address with DATABASE_POOLER).
    DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/fleethq"
    # Redis, the Dramatiq broker of the tasks process (messages only; losing them delays, never loses).
    REDIS_URL = "redis://127.0.0.1:6379/0"
    # Where the spool, the local object store and process files live by default.
    DATA_DIR = "var"
    # The master's spool directory (default <DATA_DIR>/spool).
    SPOOL_DIR = None
    # The local object store (default <DATA_DIR>/objects; unused with S3_BUCKET).
    OBJECT_STORE_DIR = None
    # Largest body of a fleet control call (heartbeat, register, receipts; DESIGN §7).
    WORKER_BODY_LIMIT = 64 * 1024
    # Largest JSON body of the SavewebHQ operations, as SavewebHQ's.
    API_BODY_LIMIT = 8 * 1024 * 1024
    # Largest JSON body of an enqueue.
    ENQUEUE_BODY_LIMIT = 8 * 1024 * 1024
    # Largest compressed body of a source import (§4.4).
    SOURCE_MAX_COMPRESSED = 256 * 1024 * 1024
    # Largest expanded size of a source import.
    SOURCE_MAX_EXPANDED = 4 * 1024**3
    # Most jobs in one source import.
    SOURCE_MAX_JOBS = 10_000_000
    # Longest line of a source import.
    SOURCE_MAX_LINE = 64 * 1024
    # Largest zstd window a source import may ask for.
    SOURCE_MAX_WINDOW = 64 * 1024 * 1024
    # Jobs committed per batch of a source import.
    SOURCE_BATCH = 20_000
    # Expired leases reset inside one claim that found the queue short.
    CLAIM_REAP_LIMIT = 64
    # Days the per-worker claim audit rows of paced projects are kept (SavewebHQ's claim buckets).
    CLAIM_BUCKET_RETENTION_DAYS = 30
    # Longest wait_ms a long-polling claim or receipt may ask for.
    LONG_POLL_MAX_MS = 30_000
    # Refresh hint sent with the project policy.
    POLICY_REFRESH_MS = 60_000
    # Spool quota: bytes of uploads streaming, staged or held at once (DESIGN §8, §12).
    SPOOL_MAX_BYTES = 2 * 1024**3
    # Where verified uploads wait for the archive: "local" (SPOOL_DIR, shared
    # by web and tasks) or "s3" (a staging prefix in the S3 store; no shared disk).
    SPOOL_BACKEND = "local"
    # Smallest PDF an upload may carry.
    UPLOAD_MIN_BYTES = 10 * 1024
    # Largest PDF an upload may carry.
    UPLOAD_MAX_BYTES = 100 * 1024 * 1024
    # The consume folder (default <DATA_DIR>/consume): files dropped there become
    # documents (``flask fleet documents consume``, docs/documents.md).
    CONSUME_DIR = None
    # The documents project of files at the consume folder's top level (a
    # subfolder named after a documents project takes its files there).
    CONSUME_PROJECT = None
    # Seconds a dropped file must stay unchanged before it is taken.
    CONSUME_SETTLE_S = 2
    # List the consume folder every this many seconds instead of inotify (for
    # network mounts, where inotify sees nothing); 0 uses inotify.
    CONSUME_POLLING_S = 0
    # Seconds a staged upload may wait for the archive before it fails (or is held).
    STAGED_RETENTION_S = 7 * 24 * 3600
    # Finished attempts kept per job, newest first; 0 keeps all (docs/operations.md "Retention").
    KEEP_ATTEMPTS_PER_JOB = 20
    # Days done outbox rows and delivered hook deliveries are kept; 0 keeps them.
    KEEP_DONE_OUTBOX_DAYS = 14
    # Days done/failed/reset_exhausted jobs are kept; 0 (an archive) keeps them.
    KEEP_FINISHED_JOBS_DAYS = 0
    # Days audit log rows are kept; 0 keeps them.
    KEEP_AUDIT_DAYS = 365
    # Rows pruned per kind and clock tick.
    PRUNE_BATCH = 5_000
    # Each tasks worker process also runs the clock, as a thread that takes
    # part in the clock election: the smallest shape (web and one tasks
    # process) then needs no clock process of its own.
    TASKS_CLOCK = False
    # The clock's periods (seconds): resetting expired leases (a claim also
    # resets its own project's when the queue runs short).
    REAP_EVERY_S = 5
    # Folding the job counters' delta rows into one row per project and state.
    FOLD_EVERY_S = 30
    # Re-sending outbox rows whose hint was lost (archives, hooks, OCR).
    RECONCILE_EVERY_S = 15
    # Sweeping the spool of uploads that were abandoned or are past retention.
    SWEEP_SPOOL_EVERY_S = 300
    # Pruning the per-worker claim audit past CLAIM_BUCKET_RETENTION_DAYS.
    PRUNE_CLAIM_BUCKETS_EVERY_S = 3600
    # Pruning by the KEEP_* settings (PRUNE_BATCH rows per kind and run).
    PRUNE_EVERY_S = 60
    # Seconds a node's heartbeat counts as fresh (pdf claims need one).
    NODE_LEASE_S = 60
    # Seconds after which a silent worker counts as gone for the lane rules.
    WORKER_STALE_S = 90
    # The GitHub OAuth App's client id (DESIGN §10); unset, sign-in is off.
    GITHUB_CLIENT_ID = None
    # The GitHub OAuth App's client secret.
    GITHUB_CLIENT_SECRET = None
    # The callback registered with the GitHub OAuth App; SavewebHQ's apps use
    # /auth/github/callback, which is served too.
    GITHUB_CALLBACK_PATH = "/login/github/callback"
    # Only members of this GitHub organisation may sign in.
    GITHUB_ORG = None
    # Members of this team of GITHUB_ORG sign in as admins.
    GITHUB_ADMIN_TEAM = None
    # GitHub's authorize URL (a setting for tests and GitHub Enterprise).
    GITHUB_AUTHORIZE_URL = "https://github.com/login/oauth/authorize"
    # GitHub's token URL.
    GITHUB_TOKEN_URL = "https://github.com/login/oauth/access_token"
    # GitHub's API.
    GITHUB_API_URL = "https://api.github.com"
    # Seconds a page session lasts.
    SESSION_LIFETIME_S = 12 * 3600
    # Sign-in attempts per client address and window, counted in PostgreSQL
    # across every process and instance.
    LOGIN_RATE_LIMIT = 20
    # The sign-in limit's window in seconds.
    LOGIN_RATE_WINDOW_S = 60
    # Enrollment attempts per client address and window.
    ENROLL_RATE_LIMIT = 10
    # The enrollment limit's window in seconds.
    ENROLL_RATE_WINDOW_S = 60
    # Reverse proxies in front of web whose X-Forwarded-For, -Proto and -Host
    # are believed (werkzeug's ProxyFix): 1 behind one nginx. 0 believes none,
    # and every client behind a proxy then shares the proxy's address in the
    # sign-in and enrollment limits.
    TRUSTED_PROXIES = 0
    # Who may read /metrics (every project id and its counts): clients from
    # these networks (comma-separated; behind a proxy, with TRUSTED_PROXIES
    # set, the client's own address) ...
    METRICS_ALLOW = "127.0.0.0/8,::1"
    # ... and, from anywhere, a scraper sending "Authorization: Bearer" and
    # this token (Prometheus: authorization.credentials). Unset: none.
    METRICS_TOKEN = None
    # Non-public networks the master may still send hook deliveries to
    # (comma-separated, e.g. a consumer on the LAN: 10.1.2.0/24). Everything
    # else loopback, private, link-local (cloud metadata) or otherwise not
    # public is refused (app/hooks/outbound.py).
    OUTBOUND_ALLOW = ""
    # The address workers and browsers use (links, enrollment commands); unset, the request's host.
    PUBLIC_URL = None
    # The development sign-in without GitHub (make dev only).
    DEV_MODE = False
    # The make dev stack's test publisher (its base URL): the enrollment page's
    # worker command then names it, so it runs as printed (make dev only).
    DEV_PUBLISHER_URL = None
    # Log lines as JSON ("true"), readable text ("false"), or "auto": JSON
    # unless stderr is a terminal (workers/logs.py).
    LOG_JSON = "auto"
    # The root log level.
    LOG_LEVEL = "INFO"
    # One log line per request (status, duration).
    ACCESS_LOG = False
    SQLALCHEMY_ENGINE_OPTIONS = {"pool_size": 10, "max_overflow": 20,
                                 "connect_args": {"application_name": "fleethq-web"}}
    # Who carries the outbox's after-commit hints: "dramatiq" (the tasks
    # process, through Redis) or "recording" (kept in memory; tests).
    OUTBOX_SENDER = "dramatiq"
    # The tasks broker in memory instead of on REDIS_URL (tests).
    STUB_BROKER = False
    # Connections of the worker-traffic pool per process (DESIGN §12: 16..64).
    FLEET_POOL_SIZE = 20
    # "transaction" when DATABASE_URL is a transaction-mode pooler (PgBouncer):
    # no server-side prepared statements, and DIRECT_DATABASE_URL required for
    # what must keep one server session (LISTEN, the clock's advisory lock).
    DATABASE_POOLER = "none"
    # The database itself, bypassing any pooler; defaults to DATABASE_URL.
    DIRECT_DATABASE_URL = None
    # The S3 bucket of the object store (docs/storage.md); unset, OBJECT_STORE_DIR is the store.
    S3_BUCKET = None
    # The S3 endpoint (MinIO or another S3-compatible service); unset, AWS.
    S3_ENDPOINT_URL = None
    # The endpoint downloaders reach, for presigned URLs.
    S3_PUBLIC_ENDPOINT_URL = None
    # The S3 region.
    S3_REGION = None
    # The S3 access key id.
    S3_ACCESS_KEY_ID = None
    # The S3 secret access key.
    S3_SECRET_ACCESS_KEY = None
    # A key prefix inside the bucket.
    S3_PREFIX = ""
    # "path" or "virtual"; path when an endpoint is set.
    S3_ADDRESSING_STYLE = None
    # Seconds to connect to S3.
    S3_CONNECT_TIMEOUT = 3
    # Seconds to wait for an S3 answer.
    S3_READ_TIMEOUT = 5
    # Tries of one S3 call, the first included.
    S3_MAX_ATTEMPTS = 3

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


# SavewebHQ's own setting names (its tracker's flags default to them), so a
# switched installation's environment and secret files work as they are.
# FleetHQ's names win where both are set.
SAVEWEBHQ_SETTINGS = {
    "HQ_DATABASE_URL": "DATABASE_URL",
    "HQ_PUBLIC_URL": "PUBLIC_URL",
    "HQ_GITHUB_CLIENT_ID": "GITHUB_CLIENT_ID",
    "HQ_OAUTH_ADMIN_ORG": "GITHUB_ORG",
    "HQ_OAUTH_ADMIN_TEAM": "GITHUB_ADMIN_TEAM",
    "HQ_WEB_SESSION_SECRET_FILE": "SECRET_KEY_FILE",
    "HQ_GITHUB_CLIENT_SECRET_FILE": "GITHUB_CLIENT_SECRET",  # the file is read (0600)
}


def _savewebhq_settings() -> dict:
    found = {}
    for name, key in SAVEWEBHQ_SETTINGS.items():
        value = os.environ.get(name)
        if not value or os.environ.get(f"FLEETHQ_{key}") or (key == "DATABASE_URL" and os.environ.get(key)):
            continue
        if key == "SECRET_KEY_FILE" and os.environ.get("FLEETHQ_SECRET_KEY"):
            continue
        if name == "HQ_GITHUB_CLIENT_SECRET_FILE":
            value = read_secret_file(value)
        found[key] = value
    return found


def load(overrides: dict | None = None) -> dict:
    cfg = {k: v for k, v in vars(Defaults).items() if k.isupper()}
    cfg.update(_savewebhq_settings())
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
            or os.environ.get("FLEETHQ_DATABASE_URL") or os.environ.get("HQ_DATABASE_URL")):
        found = stack_urls(cfg["DATA_DIR"])
        if "REDIS_URL" in overrides or os.environ.get("REDIS_URL") or os.environ.get("FLEETHQ_REDIS_URL"):
            found.pop("REDIS_URL", None)
        if cfg.get("SECRET_KEY") or cfg.get("SECRET_KEY_FILE"):
            found.pop("SECRET_KEY_FILE", None)
        cfg.update(found)
    if os.environ.get("FLEETHQ_SECRET_KEY") and os.environ.get("FLEETHQ_SECRET_KEY_FILE"):
        raise ConfigError("set FLEETHQ_SECRET_KEY or FLEETHQ_SECRET_KEY_FILE, not both")
    if cfg.get("SECRET_KEY_FILE") and not cfg.get("SECRET_KEY"):  # a key given to create_app wins
        cfg["SECRET_KEY"] = read_secret_file(cfg["SECRET_KEY_FILE"])
    cfg["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(cfg["DATABASE_URL"])
    if cfg["OUTBOX_SENDER"] not in OUTBOX_SENDERS:
        raise ConfigError(f"OUTBOX_SENDER must be one of {', '.join(OUTBOX_SENDERS)}, "
                          f"not {cfg['OUTBOX_SENDER']!r}")
    metrics_networks(cfg)  # refused at start, not at the first scrape or delivery
    outbound_networks(cfg)
    size = _bounded_int(cfg, "FLEET_POOL_SIZE", 16, 64)
    for key, low, high in RETENTION_BOUNDS:
        _bounded_int(cfg, key, low, high)
    for key in CLOCK_PERIODS:
        _bounded_int(cfg, key, 1, 86_400)
    _check_kinds(cfg)  # after the bounded ones, whose messages say more
    if not re.fullmatch(r"[A-Za-z0-9]{1,15}_", str(cfg["MACHINE_TOKEN_PREFIX"])) or \
            cfg["MACHINE_TOKEN_PREFIX"] == "fhqn_":
        raise ConfigError("MACHINE_TOKEN_PREFIX must be 1..15 letters or digits and an underscore "
                          f"(fhq_, hq_), not an enrolled node's fhqn_: {cfg['MACHINE_TOKEN_PREFIX']!r}")
    session_args = _pooler_connect_args(cfg)
    if cfg["SPOOL_BACKEND"] not in SPOOL_BACKENDS:
        raise ConfigError(f"SPOOL_BACKEND must be {' or '.join(SPOOL_BACKENDS)}, "
                          f"not {cfg['SPOOL_BACKEND']!r}")
    if cfg["SPOOL_BACKEND"] == "s3" and not cfg.get("S3_BUCKET"):
        raise ConfigError("SPOOL_BACKEND=s3 stages uploads in the object store: set S3_BUCKET")
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
SPOOL_BACKENDS = ("local", "s3")


def _pooler_connect_args(cfg: dict) -> dict:
    """psycopg arguments for the pooled engines. Behind a transaction-mode
    pooler one client's transactions land on different server sessions, so a
    statement prepared in one would be missing (or already taken) in the next:
    psycopg must never prepare (``prepare_threshold=None``)."""
    pooler = cfg["DATABASE_POOLER"]
    if pooler not in DATABASE_POOLERS:
        raise ConfigError(f"DATABASE_POOLER must be one of {', '.join(DATABASE_POOLERS)}, "
                          f"not {pooler!r}")
    if pooler == "none":
        return {}
    if not cfg["DIRECT_DATABASE_URL"]:
        raise ConfigError("DATABASE_POOLER=transaction needs DIRECT_DATABASE_URL: LISTEN/NOTIFY "
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
# The clock's periods: at least a second, at most a day.
CLOCK_PERIODS = ("REAP_EVERY_S", "FOLD_EVERY_S", "RECONCILE_EVERY_S", "SWEEP_SPOOL_EVERY_S",
                 "PRUNE_CLAIM_BUCKETS_EVERY_S", "PRUNE_EVERY_S")


def _check_kinds(cfg: dict) -> None:
    """A number or switch setting must hold one: ``FLEETHQ_NODE_LEASE_S=soon``
    is refused at start, not met as a TypeError in some request later."""
    for key, default in vars(Defaults).items():
        if not key.isupper() or default is None or isinstance(default, (str, dict)):
            continue
        value = cfg.get(key)
        if key.startswith("S3_"):
            # Plain S3_* variables come as text, parsed as numbers by the store.
            try:
                float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{key} must be a number, not {value!r}") from None
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{key} must be true or false, not {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer, not {value!r}")


def metrics_networks(cfg: dict) -> tuple:
    """The networks of ``METRICS_ALLOW``."""
    return _networks(cfg, "METRICS_ALLOW")


def outbound_networks(cfg: dict) -> tuple:
    """The networks of ``OUTBOUND_ALLOW``."""
    return _networks(cfg, "OUTBOUND_ALLOW")


def _networks(cfg: dict, key: str) -> tuple:
    try:
        return tuple(ipaddress.ip_network(part.strip(), strict=False)
                     for part in str(cfg.get(key) or "").split(",") if part.strip())
    except ValueError as exc:
        raise ConfigError(f"{key} must be comma-separated networks (like 127.0.0.0/8,::1), "
                          f"not {cfg[key]!r}: {exc}") from None


def _bounded_int(cfg: dict, key: str, low: int, high: int) -> int:
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{key} must be an integer {low}..{high}, not {value!r}")
    return value


def read_secret_file(path: str) -> str:
    """A secret kept in a private file: refused when group or others may read it."""
    try:
        value = read_private(path, 2048).decode("utf-8").strip()
    except OpenToOthers:
        raise ConfigError(f"secret file {path} must not allow group or other access (chmod 600)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read secret file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"secret file {path} is not UTF-8 text") from None
    if not value or len(value) > 1024:
        raise ConfigError(f"secret file {path} must hold 1..1024 characters")
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

# The state file of a running ``make dev`` stack (``<data dir>/devstack.json``,
# written by app.dev.state): a second shell's ``flask fleet …`` finds the
# stack's PostgreSQL, Redis and web address through it.
STACK_STATE_FILE = "devstack.json"
_STACK_PROBE_TIMEOUT_S = 0.5


def stack_urls(data_dir: str | os.PathLike) -> dict[str, str]:
    """``{"DATABASE_URL": …[, "REDIS_URL": …][, "SECRET_KEY_FILE": …]}`` of a
    stack whose PostgreSQL answers, else ``{}``. Redis is included only when
    it answers too; the key file when the stack made its own key."""
    state = read_stack_state(Path(data_dir) / STACK_STATE_FILE)
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


def stack_web_url(data_dir: str | os.PathLike) -> str | None:
    """The web address of a live ``make dev`` stack in ``data_dir`` (its
    FLEETHQ_PORT, not always 8400), or None."""
    state = read_stack_state(Path(data_dir) / STACK_STATE_FILE)
    url = state.get("web_url") if state else None
    if not isinstance(url, str) or not _answers(url, default_port=80):
        return None
    return url


def read_stack_state(path: Path) -> dict | None:
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
                sock.settimeout(_STACK_PROBE_TIMEOUT_S)
                sock.connect(parts.path)
            return True
        host = parts.hostname or "127.0.0.1"
        with socket.create_connection((host, parts.port or default_port), timeout=_STACK_PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False
