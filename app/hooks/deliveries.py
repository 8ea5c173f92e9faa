"""Webhook deliveries: at least once, HMAC-signed, retried with backoff.

A consumer answers 2xx (delivered) or 202 (accepted: the delivery stays
``awaiting_callback`` until the consumer confirms durable completion through
the callback URL with the one-time callback token). Anything else is retried
with exponential backoff up to ``MAX_TRIES`` times, keeping the last error.
Consumers must coalesce duplicates: a delivery may arrive more than once.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time

import requests
from sqlalchemy import text

from app.accounts import tokens
from app.errors import Conflict, InvalidToken, NotFound
from app.extensions import db
from app.hooks import outbox

log = logging.getLogger(__name__)
MAX_TRIES = 20
CALLBACK_PREFIX = "fhqc_"
STATES = ("pending", "awaiting_callback", "delivered", "failed")
SIGNATURE_HEADER = "X-FleetHQ-Signature"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def queue_for_asset(project_id: str, attempt_id: int, asset_key: str) -> int:
    """One pending delivery per enabled consumer, plus its outbox row (caller commits)."""
    ids = db.session.execute(text(
        "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key) "
        "SELECT id, project_id, :a, :k FROM hook_consumers WHERE project_id = :p AND enabled "
        "ON CONFLICT (consumer_id, attempt_id) DO NOTHING RETURNING id"),
        {"p": project_id, "a": attempt_id, "k": asset_key}).scalars().all()
    for delivery_id in ids:
        outbox.add("hook_delivery", delivery_id)
    return len(ids)


def callback_token(secret_key: str, delivery_id: int) -> str:
    """The delivery's callback token: the same on every (re)delivery, so a
    consumer that coalesces duplicates can confirm with whichever it kept."""
    mac = hmac.new(secret_key.encode(), f"hook-callback:{delivery_id}".encode(), hashlib.sha256).digest()
    return CALLBACK_PREFIX + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def _payload(delivery_id: int, download_url_for, secret_key: str,
             public_url: str) -> tuple[dict, str, str] | None:
    row = db.session.execute(text("""
        SELECT d.id, d.state, d.attempt_id, d.asset_key, d.project_id, c.url, c.secret, c.enabled,
               u.canonical_key, u.sha256, u.size, u.job_id
        FROM hook_deliveries d JOIN hook_consumers c ON c.id = d.consumer_id
        JOIN uploads u ON u.attempt_id = d.attempt_id
        WHERE d.id = :d"""), {"d": delivery_id}).mappings().first()
    if row is None or row["state"] != "pending":
        return None
    if not row["enabled"]:
        db.session.execute(text(
            "UPDATE hook_deliveries SET state = 'failed', last_error = 'consumer disabled', "
            "updated_at = now() WHERE id = :d AND state = 'pending'"), {"d": delivery_id})
        return None
    url, expires_at = download_url_for(row["asset_key"])
    callback = callback_token(secret_key, delivery_id)
    db.session.execute(text("UPDATE hook_deliveries SET callback_token_hash = :h WHERE id = :d"),
                       {"h": tokens.digest(callback), "d": delivery_id})
    payload = {
        "event": "asset.archived", "delivery_id": str(row["id"]), "project_id": row["project_id"],
        "job_id": row["job_id"], "attempt_id": str(row["attempt_id"]),
        "asset_key": row["asset_key"], "canonical_key": row["canonical_key"],
        "sha256": row["sha256"], "size": row["size"],
        "download_url": url, "download_expires_at": expires_at,
        "callback_url": f"{public_url}/api/v1/hooks/deliveries/{row['id']}/complete",
        "callback_token": callback,
    }
    return payload, row["url"], row["secret"]


def deliver(delivery_id: int, download_url_for, *, secret_key: str, public_url: str | None = None,
            timeout_s: float = 10.0) -> str | None:
    """Attempt one delivery. No transaction is open during the HTTP call.

    Parameters:
        download_url_for: object key → (url, expires_at).
        secret_key: derives the delivery's stable callback token.
        public_url: the master's external base URL for the callback link.

    Returns the new state, or None when there was nothing to do.
    """
    prepared = _payload(delivery_id, download_url_for, secret_key, (public_url or "").rstrip("/"))
    db.session.commit()
    if prepared is None:
        outbox.done("hook_delivery", delivery_id)
        db.session.commit()
        return None
    payload, url, secret = prepared
    body = json.dumps(payload, separators=(",", ":")).encode()
    now = int(time.time())
    headers = {"Content-Type": "application/json", "X-FleetHQ-Delivery": payload["delivery_id"],
               "X-FleetHQ-Timestamp": str(now), SIGNATURE_HEADER: sign(secret, now, body),
               "User-Agent": "FleetHQ-Hooks/1"}
    try:
        response = requests.post(url, data=body, headers=headers, timeout=timeout_s,
                                 allow_redirects=False)
        status, error = response.status_code, None if response.status_code < 300 else \
            f"HTTP {response.status_code}: {response.text[:200]}"
    except requests.RequestException as exc:
        status, error = None, f"{exc.__class__.__name__}: {str(exc)[:200]}"
    if error is None:
        state = "awaiting_callback" if status == 202 else "delivered"
        db.session.execute(text(
            "UPDATE hook_deliveries SET state = :s, tries = tries + 1, last_status = :st, "
            "last_error = NULL, updated_at = now(), "
            "delivered_at = CASE WHEN :s = 'delivered' THEN now() END "
            "WHERE id = :d AND state = 'pending'"), {"s": state, "st": status, "d": delivery_id})
        outbox.done("hook_delivery", delivery_id)
        db.session.commit()
        return state
    tries = db.session.execute(text(
        "UPDATE hook_deliveries SET tries = tries + 1, last_status = :st, last_error = :e, "
        "updated_at = now(), state = CASE WHEN tries + 1 >= :max THEN 'failed' ELSE state END "
        "WHERE id = :d AND state = 'pending' RETURNING tries"),
        {"st": status, "e": error, "d": delivery_id, "max": MAX_TRIES}).scalar()
    if tries is not None and tries < MAX_TRIES:
        outbox.retry_later("hook_delivery", delivery_id, error)
        state = "pending"
    else:
        outbox.done("hook_delivery", delivery_id)
        state = "failed"
    db.session.commit()
    return state


def confirm(delivery_id: int, callback_token: str) -> dict:
    """The consumer's completion callback after a 202. Commits."""
    row = db.session.execute(text(
        "SELECT state, callback_token_hash FROM hook_deliveries WHERE id = :d"),
        {"d": delivery_id}).first()
    if row is None:
        raise NotFound("no such delivery")
    if not row[1] or not tokens.matches(callback_token, row[1]):
        raise InvalidToken("invalid callback token")
    if row[0] == "delivered":
        return {"delivery_id": str(delivery_id), "state": "delivered"}  # replayed callback
    # A fast consumer may call back before its 202 answer was recorded (pending).
    moved = db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'delivered', delivered_at = now(), updated_at = now() "
        "WHERE id = :d AND state IN ('pending', 'awaiting_callback')"), {"d": delivery_id}).rowcount
    if not moved:
        raise Conflict(f"delivery is {row[0]}", code="invalid_transition")
    db.session.commit()
    return {"delivery_id": str(delivery_id), "state": "delivered"}


def retry_now(delivery_id: int) -> dict:
    """Admin: put a failed or waiting delivery back to pending, due now. Commits."""
    moved = db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'pending', updated_at = now() "
        "WHERE id = :d AND state IN ('failed', 'pending', 'awaiting_callback') RETURNING id"),
        {"d": delivery_id}).first()
    if moved is None:
        raise NotFound("no such delivery, or it was delivered")
    # A manual retry starts a fresh series of tries.
    db.session.execute(text("UPDATE hook_deliveries SET tries = 0 WHERE id = :d"), {"d": delivery_id})
    db.session.execute(text(
        "UPDATE outbox SET due_at = now() WHERE topic = 'hook_delivery' AND ref = :d AND done_at IS NULL"),
        {"d": delivery_id})
    outbox.add("hook_delivery", delivery_id)
    db.session.commit()
    return get(delivery_id)


def get(delivery_id: int) -> dict:
    row = db.session.execute(text(
        "SELECT d.id, d.consumer_id, c.url, d.project_id, d.attempt_id, d.asset_key, d.state, d.tries, "
        "d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at "
        "FROM hook_deliveries d JOIN hook_consumers c ON c.id = d.consumer_id WHERE d.id = :d"),
        {"d": delivery_id}).mappings().first()
    if row is None:
        raise NotFound("no such delivery")
    return _delivery_dict(row)


def _ts(value):
    return int(value.timestamp()) if value is not None else None


def _delivery_dict(row) -> dict:
    return {"delivery_id": str(row["id"]), "consumer_id": str(row["consumer_id"]),
            "url": row["url"], "project_id": row["project_id"], "attempt_id": str(row["attempt_id"]),
            "asset_key": row["asset_key"], "state": row["state"], "tries": row["tries"],
            "last_status": row["last_status"], "last_error": row["last_error"],
            "created_at": _ts(row["created_at"]), "updated_at": _ts(row["updated_at"]),
            "delivered_at": _ts(row["delivered_at"])}


def list_deliveries(*, project_id=None, state=None, limit: int = 200) -> list[dict]:
    where, params = [], {"n": limit}
    if project_id:
        where.append("d.project_id = :p")
        params["p"] = project_id
    if state:
        where.append("d.state = :s")
        params["s"] = state
    rows = db.session.execute(text(
        "SELECT d.id, d.consumer_id, c.url, d.project_id, d.attempt_id, d.asset_key, d.state, d.tries, "
        "d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at "
        "FROM hook_deliveries d JOIN hook_consumers c ON c.id = d.consumer_id "
        f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY d.id DESC LIMIT :n"),
        params).mappings().all()
    return [_delivery_dict(r) for r in rows]
