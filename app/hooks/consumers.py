"""Per-project webhook consumers: URL, secret, enabled, completion timeout.

Disabling a consumer is on purpose: its open deliveries become ``skipped``
when they come due. Re-enabling it sends them again (the reconciler moves
skipped deliveries back to pending, a batch per tick) and the backfill
queues the assets archived while it was off (app/hooks/backfill.py).
"""
from __future__ import annotations

import json
import secrets
from urllib.parse import urlsplit, urlunsplit

from flask import current_app
from sqlalchemy import text

from app import audit, sealing
from app.errors import InvalidRequest, NotFound
from app.extensions import db
from app.config import outbound_networks
from app.hooks import derived, outbound
from app.hooks.models import COMPLETION_TIMEOUT_BOUNDS_S, COMPLETION_TIMEOUT_DEFAULT_S


# Signing secrets are sealed under SECRET_KEY (app/sealing.py), bound to
# their consumer row; a database dump alone reveals none.
_SEAL_PURPOSE = b"fleethq hook-secret seal v1"


def _bound_to(consumer_id: int, project_id: str) -> bytes:
    return f"{consumer_id}\x00{project_id}".encode()


def signing_secret(secret_key: str, consumer_id: int, project_id: str, clear: str | None,
                   sealed: bytes | None) -> str | None:
    """A consumer's signing secret, or None when its sealed copy does not
    open under ``secret_key`` (SECRET_KEY changed, or a process that made its
    own key): deliveries then fail and are retried, and sign again once the
    key is the one the secret was sealed under."""
    if clear is not None:
        return clear
    raw = sealing.unseal(secret_key, _SEAL_PURPOSE, _bound_to(consumer_id, project_id), sealed)
    return raw.decode() if raw is not None else None


def seal_clear_secrets(config, batch: int = 500) -> int:
    """Seal the signing secrets still kept in clear (rows from before
    revision 0025, or made where SECRET_KEY was not configured); nothing
    when this process's key is its own. The one place a clear secret turns
    sealed. Commits; returns how many were sealed."""
    key = sealing.configured_key(config)
    if key is None:
        return 0
    rows = db.session.execute(text(
        "SELECT id, project_id, secret FROM hook_consumers WHERE secret IS NOT NULL "
        "ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED"), {"n": batch}).all()
    for consumer_id, project_id, secret in rows:
        db.session.execute(text(
            "UPDATE hook_consumers SET secret_sealed = :s, secret = NULL WHERE id = :id"),
            {"id": consumer_id, "s": sealing.seal(key, _SEAL_PURPOSE, _bound_to(consumer_id, project_id),
                                                   secret.encode())})
    db.session.commit()
    return len(rows)


def _check_url(url) -> str:
    if not isinstance(url, str) or len(url) > 2048:
        raise InvalidRequest("url must be a string of at most 2048 characters", details={"field": "url"})
    try:
        return outbound.check_url(url, outbound_networks(current_app.config))
    except ValueError as exc:
        raise InvalidRequest(str(exc), details={"field": "url"}) from None


def _shown_url(url: str | None) -> str | None:
    """A consumer URL as the audit log keeps it: no user:password, no query
    (either may carry a credential)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _check_timeout(value) -> int:
    lo, hi = COMPLETION_TIMEOUT_BOUNDS_S
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidRequest(f"completion_timeout_seconds must be an integer from {lo} to {hi}",
                             details={"field": "completion_timeout_seconds"})
    return value


def _dict(row, secret: str | None = None) -> dict:
    out = {"consumer_id": str(row["id"]), "project_id": row["project_id"], "name": row["name"],
           "kind": row["kind"], "url": row["url"], "target_project": row["target_project_id"],
           "profile": row["profile"], "enabled": row["enabled"],
           "completion_timeout_seconds": row["completion_timeout_seconds"],
           "created_at": int(row["created_at"].timestamp())}
    if secret is not None:
        out["secret"] = secret  # shown once, at creation
    return out


_COLUMNS = ("id, project_id, name, kind, url, target_project_id, profile, enabled, "
            "completion_timeout_seconds, created_at")


def create(project_id: str, name: str, url: str | None = None, secret: str | None = None,
           enabled: bool = True, completion_timeout_seconds: int = COMPLETION_TIMEOUT_DEFAULT_S, *,
           kind: str = "webhook", target_project: str | None = None, profile: dict | None = None) -> dict:
    """A new consumer; the backfill then queues a delivery for every asset
    the project archived before it existed. A ``webhook`` needs ``url``; a
    ``derive`` consumer needs ``target_project`` and ``profile`` instead
    (app/hooks/derived.py). Commits."""
    if not isinstance(name, str) or not 1 <= len(name) <= 128:
        raise InvalidRequest("name must be 1..128 characters", details={"field": "name"})
    if kind == "webhook":
        if url is None:
            raise InvalidRequest("a webhook consumer needs a url", details={"field": "url"})
        if target_project is not None or profile is not None:
            raise InvalidRequest("target_project and profile are for derive consumers",
                                 details={"field": "target_project" if target_project else "profile"})
        url = _check_url(url)
    elif kind == "derive":
        if url is not None:
            raise InvalidRequest("a derive consumer has no url", details={"field": "url"})
        if target_project is None or profile is None:
            raise InvalidRequest("a derive consumer needs target_project and profile",
                                 details={"field": "profile" if target_project else "target_project"})
        target_project = derived.check_target(project_id, target_project)
        profile = derived.check_profile(profile)
    else:
        raise InvalidRequest("kind must be webhook or derive", details={"field": "kind"})
    secret = secret or secrets.token_urlsafe(32)
    if not isinstance(secret, str) or not 16 <= len(secret) <= 256:
        raise InvalidRequest("secret must be 16..256 characters", details={"field": "secret"})
    # The id first: the sealed secret is bound to its row.
    consumer_id = db.session.execute(text(
        "SELECT nextval(pg_get_serial_sequence('hook_consumers', 'id'))")).scalar_one()
    key = sealing.configured_key(current_app.config)
    sealed = (sealing.seal(key, _SEAL_PURPOSE, _bound_to(consumer_id, project_id), secret.encode())
              if key is not None else None)
    row = db.session.execute(text(
        f"INSERT INTO hook_consumers (id, project_id, name, kind, url, target_project_id, profile, "
        f"secret, secret_sealed, enabled, completion_timeout_seconds) "
        f"VALUES (:id, :p, :n, :kind, :u, :tp, CAST(:prof AS jsonb), :s, :sealed, :e, :t) "
        f"RETURNING {_COLUMNS}"),
        {"id": consumer_id, "p": project_id, "n": name, "kind": kind, "u": url, "tp": target_project,
         "prof": json.dumps(profile) if profile is not None else None,
         "s": secret if sealed is None else None, "sealed": sealed,
         "e": bool(enabled), "t": _check_timeout(completion_timeout_seconds)}).mappings().one()
    audit.record("hook.create", "hook_consumer", row["id"], {  # never the secret
        "project": project_id, "name": name, "kind": kind, "url": _shown_url(url),
        "target_project": target_project,
        "enabled": bool(enabled)})
    db.session.commit()
    return _dict(row, secret)


def list_for(project_id: str) -> list[dict]:
    rows = db.session.execute(text(
        f"SELECT {_COLUMNS} FROM hook_consumers WHERE project_id = :p ORDER BY id"),
        {"p": project_id}).mappings().all()
    return [_dict(r) for r in rows]


def update(project_id: str, consumer_id: int, *, url=None, enabled=None, name=None,
           completion_timeout_seconds=None) -> dict:
    fields, params = [], {"p": project_id, "id": consumer_id}
    if url is not None:
        # A derive consumer has no URL (the kind constraint refuses one).
        fields.append("url = CASE WHEN kind = 'webhook' THEN :u ELSE url END")
        params["u"] = _check_url(url)
    if enabled is not None:
        if not isinstance(enabled, bool):
            raise InvalidRequest("enabled must be true or false", details={"field": "enabled"})
        # Re-enabled: the backfill goes back to the first asset archived since
        # the consumer was disabled, so those archived while it was off get a
        # delivery. Not further back: a delivered row pruned by retention must
        # not look like a missing one. (SET sees the old row's values.)
        fields += ["enabled = :e",
                   "disabled_at = CASE WHEN :e THEN NULL WHEN enabled THEN now() ELSE disabled_at END",
                   "backfilled_through = CASE WHEN :e AND NOT enabled THEN LEAST(backfilled_through, "
                   "COALESCE((SELECT min(a.attempt_id) - 1 FROM assets a "
                   "WHERE a.project_id = hook_consumers.project_id "
                   "AND a.created_at >= COALESCE(hook_consumers.disabled_at, '-infinity')), "
                   "backfilled_through)) ELSE backfilled_through END"]
        params["e"] = enabled
    if name is not None:
        fields.append("name = :n")
        params["n"] = name
    if completion_timeout_seconds is not None:
        fields.append("completion_timeout_seconds = :t")
        params["t"] = _check_timeout(completion_timeout_seconds)
    if not fields:
        raise InvalidRequest("nothing to change")
    row = db.session.execute(text(
        f"UPDATE hook_consumers SET {', '.join(fields)} WHERE id = :id AND project_id = :p "
        f"RETURNING {_COLUMNS}"), params).mappings().first()
    if row is None:
        raise NotFound("no such consumer")
    changed = {field: params[key] for key, field in (
        ("e", "enabled"), ("n", "name"), ("t", "completion_timeout_seconds")) if key in params}
    if "u" in params:
        changed["url"] = _shown_url(params["u"])
    audit.record("hook.update", "hook_consumer", consumer_id, {"project": project_id, **changed})
    db.session.commit()
    return _dict(row)


def delete(project_id: str, consumer_id: int) -> None:
    gone = db.session.execute(text("DELETE FROM hook_consumers WHERE id = :id AND project_id = :p"),
                              {"id": consumer_id, "p": project_id}).rowcount
    if not gone:
        raise NotFound("no such consumer")
    audit.record("hook.delete", "hook_consumer", consumer_id, {"project": project_id})
    db.session.commit()
