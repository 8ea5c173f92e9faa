"""Webhook deliveries: at least once, HMAC-signed, retried with backoff.

A consumer's answer decides (docs/hooks.md):
- 200, 201, 203, 204 … (any 2xx but 202): done, the delivery is ``delivered``;
- 202: accepted, not done. The delivery is ``awaiting_callback`` until the
  consumer confirms durable completion through the callback URL with the
  delivery's callback token. Without a callback within the consumer's
  ``completion_timeout_seconds`` it is sent again (same delivery id, same
  callback token), with the usual backoff on top, within the same tries;
- anything else (or no answer): retried with exponential backoff.
After ``MAX_TRIES`` POSTs without completion the delivery is ``failed``. A
consumer disabled on purpose has its deliveries ``skipped``, not failed.
Consumers must coalesce duplicates: a delivery may arrive more than once.

Every ``pending`` or ``awaiting_callback`` delivery has an open outbox row, so
the reconciler re-drives it after any restart.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time


from sqlalchemy import text

from app import outbox
from app.accounts import tokens
from app.errors import InvalidToken, NotFound
from app.extensions import db
from app.hooks import consumers, derived, outbound
from app.hooks.models import DELIVERY_STATES

log = logging.getLogger(__name__)
MAX_TRIES = 20
CALLBACK_PREFIX = "fhqc_"
STATES = DELIVERY_STATES
OPEN_STATES = ("pending", "awaiting_callback")
SIGNATURE_HEADER = "X-FleetHQ-Signature"
ACCEPTED = 202  # the one 2xx that does not mean done


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def queue_for_asset(project_id: str, attempt_id: int, asset_key: str) -> int:
    """One delivery per enabled consumer, with its outbox row (caller
    commits). A webhook's is pending, POSTed after commit; a derive
    consumer's enqueues its derived job right here, in this transaction."""
    rows = db.session.execute(text(
        "WITH queued AS (INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key) "
        "SELECT id, project_id, :a, :k FROM hook_consumers WHERE project_id = :p AND enabled "
        "ON CONFLICT (consumer_id, attempt_id) DO NOTHING RETURNING id, consumer_id) "
        "SELECT q.id, c.kind FROM queued q JOIN hook_consumers c ON c.id = q.consumer_id"),
        {"p": project_id, "a": attempt_id, "k": asset_key}).all()
    outbox.add_many("hook_delivery", [r[0] for r in rows if r[1] == "webhook"])
    for delivery_id, kind in rows:
        if kind == "derive":
            derived.advance(delivery_id)
    return len(rows)


def callback_token(secret_key: str, delivery_id: int) -> str:
    """The delivery's callback token: the same on every (re)delivery, so a
    consumer that coalesces duplicates can confirm with whichever it kept."""
    mac = hmac.new(secret_key.encode(), f"hook-callback:{delivery_id}".encode(), hashlib.sha256).digest()
    return CALLBACK_PREFIX + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


# What _prepare answers when there is nothing to POST now, or when the
# delivery is a derive consumer's (no HTTP: app/hooks/derived.py).
FINAL, LATER, DERIVE = "final", "later", "derive"
UNSEALED = ("the consumer's signing secret does not open under this SECRET_KEY "
            "(it was sealed under another); retried")


def _prepare(delivery_id: int, download_url_for, secret_key: str, public_url: str):
    """The payload to POST, or FINAL (nothing left to do: close the outbox
    row) or LATER (a 202 still within its completion timeout)."""
    row = db.session.execute(text("""
        SELECT d.id, d.state, d.tries, d.attempt_id, d.asset_key, d.project_id, d.consumer_id,
               d.awaiting_until > now() AS waiting, c.url, c.secret, c.secret_sealed, c.enabled,
               c.completion_timeout_seconds, c.kind, u.canonical_key, u.sha256, u.size, u.job_id
        FROM hook_deliveries d JOIN hook_consumers c ON c.id = d.consumer_id
        JOIN uploads u ON u.attempt_id = d.attempt_id
        WHERE d.id = :d FOR UPDATE OF d"""), {"d": delivery_id}).mappings().first()
    if row is not None and row["kind"] == "derive":
        return DERIVE
    if row is None or row["state"] not in OPEN_STATES:
        return FINAL
    if not row["enabled"]:
        _close(delivery_id, "skipped", "consumer disabled")
        return FINAL
    if row["state"] == "awaiting_callback":
        if row["waiting"]:
            return LATER  # an early duplicate hint; the outbox row is due at awaiting_until
        waited = f"no completion callback within {row['completion_timeout_seconds']} s of the 202"
        if row["tries"] >= MAX_TRIES:
            _close(delivery_id, "failed", f"{waited} (last of {MAX_TRIES} tries)")
            return FINAL
        # Re-drive: the consumer may have lost the job (restarted before it was durable).
        db.session.execute(text(
            "UPDATE hook_deliveries SET state = 'pending', last_error = :e, awaiting_until = NULL, "
            "updated_at = now() WHERE id = :d"), {"d": delivery_id, "e": waited})
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
    secret = consumers.signing_secret(secret_key, row["consumer_id"], row["project_id"],
                                      row["secret"], row["secret_sealed"])
    return payload, row["url"], secret, row["completion_timeout_seconds"]


def _close(delivery_id: int, state: str, error: str) -> None:
    db.session.execute(text(
        "UPDATE hook_deliveries SET state = :s, last_error = :e, awaiting_until = NULL, "
        "updated_at = now() WHERE id = :d AND state IN ('pending', 'awaiting_callback')"),
        {"d": delivery_id, "s": state, "e": error})


def deliver(delivery_id: int, download_url_for, *, secret_key: str, public_url: str | None = None,
            timeout_s: float = 10.0, allow: tuple = ()) -> str | None:
    """Attempt one delivery. No transaction is open during the HTTP call.

    Parameters:
        download_url_for: object key → (url, expires_at).
        secret_key: derives the delivery's stable callback token.
        public_url: the master's external base URL for the callback link.
        allow: non-public networks the delivery may still reach
            (``OUTBOUND_ALLOW``; app/hooks/outbound.py).

    Returns the new state, or None when there was nothing to do.
    """
    prepared = _prepare(delivery_id, download_url_for, secret_key, (public_url or "").rstrip("/"))
    if prepared == DERIVE:  # no HTTP: enqueue (or look at) the derived job
        state = derived.advance(delivery_id)
        db.session.commit()
        return state
    if prepared == LATER:
        db.session.rollback()
        return None
    if prepared == FINAL:
        outbox.done("hook_delivery", delivery_id)
        db.session.commit()
        return None
    payload, url, secret, completion_timeout_s = prepared
    if secret is None:  # sealed under another key: nothing to sign with until SECRET_KEY is that key again
        state = _failed_try(delivery_id, None, UNSEALED)
        db.session.commit()
        return state
    db.session.commit()
    body = json.dumps(payload, separators=(",", ":")).encode()
    now = int(time.time())
    headers = {"Content-Type": "application/json", "X-FleetHQ-Delivery": payload["delivery_id"],
               "X-FleetHQ-Timestamp": str(now), SIGNATURE_HEADER: sign(secret, now, body),
               "User-Agent": outbound.USER_AGENT}
    answer = outbound.post(url, body, headers, timeout_s=timeout_s, allow=allow)
    status, error = answer.status, answer.error
    if error is None and status == ACCEPTED:
        state = _accepted(delivery_id, completion_timeout_s)
    elif error is None:
        state = _delivered(delivery_id, status)
    else:
        state = _failed_try(delivery_id, status, error)
    db.session.commit()
    return state


def _delivered(delivery_id: int, status: int) -> str:
    db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'delivered', tries = tries + 1, last_status = :st, "
        "last_error = NULL, updated_at = now(), delivered_at = now() "
        "WHERE id = :d AND state = 'pending'"), {"st": status, "d": delivery_id})
    outbox.done("hook_delivery", delivery_id)
    return _state(delivery_id)


def _accepted(delivery_id: int, completion_timeout_s: int) -> str:
    """202: keep the outbox row open, due when the completion timeout (plus
    backoff) runs out; the callback closes it earlier. The delivery row is
    locked before the outbox row, as everywhere, so a racing callback waits."""
    moved = db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'awaiting_callback', tries = tries + 1, "
        "last_status = 202, last_error = NULL, updated_at = now() "
        "WHERE id = :d AND state = 'pending'"), {"d": delivery_id}).rowcount
    if not moved:  # the callback came first
        outbox.done("hook_delivery", delivery_id)
        return _state(delivery_id)
    due = outbox.wait_then_retry("hook_delivery", delivery_id,
                                 "accepted (202), awaiting the completion callback",
                                 completion_timeout_s)
    db.session.execute(text("UPDATE hook_deliveries SET awaiting_until = :due WHERE id = :d"),
                       {"d": delivery_id, "due": due})
    return "awaiting_callback"


def _failed_try(delivery_id: int, status: int | None, error: str) -> str:
    tries = db.session.execute(text(
        "UPDATE hook_deliveries SET tries = tries + 1, last_status = :st, last_error = :e, "
        "updated_at = now(), state = CASE WHEN tries + 1 >= :max THEN 'failed' ELSE state END "
        "WHERE id = :d AND state = 'pending' RETURNING tries"),
        {"st": status, "e": error, "d": delivery_id, "max": MAX_TRIES}).scalar()
    if tries is not None and tries < MAX_TRIES:
        outbox.retry_later("hook_delivery", delivery_id, error)
    else:
        outbox.done("hook_delivery", delivery_id)
    return _state(delivery_id)


def _state(delivery_id: int) -> str | None:
    return db.session.execute(text("SELECT state FROM hook_deliveries WHERE id = :d"),
                              {"d": delivery_id}).scalar()


def confirm(delivery_id: int, callback_token: str) -> dict:
    """The consumer's completion callback: its word that the work is durably
    done. It ends the delivery whatever FleetHQ concluded meanwhile (a fast
    callback before the 202 was recorded, a late one after a re-send, or after
    the last try). Replays are idempotent. Commits."""
    row = db.session.execute(text(
        "SELECT state, callback_token_hash FROM hook_deliveries WHERE id = :d"),
        {"d": delivery_id}).first()
    if row is None:
        raise NotFound("no such delivery")
    if not row[1] or not tokens.matches(callback_token, row[1]):
        raise InvalidToken("invalid callback token")
    db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'delivered', delivered_at = now(), updated_at = now(), "
        "awaiting_until = NULL WHERE id = :d AND state <> 'delivered'"), {"d": delivery_id})
    outbox.done("hook_delivery", delivery_id)
    db.session.commit()
    return {"delivery_id": str(delivery_id), "state": "delivered"}


def retry_now(delivery_id: int) -> dict:
    """Admin: put a failed, skipped or waiting delivery back to pending, due
    now. Commits."""
    moved = db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'pending', updated_at = now(), awaiting_until = NULL "
        "WHERE id = :d AND state <> 'delivered' RETURNING id"),
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
        "SELECT d.id, d.consumer_id, c.url, c.kind, d.project_id, d.attempt_id, d.asset_key, d.state, d.tries, "
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
            "url": row["url"], "kind": row["kind"], "project_id": row["project_id"],
            "attempt_id": str(row["attempt_id"]),
            "asset_key": row["asset_key"], "state": row["state"], "tries": row["tries"],
            "last_status": row["last_status"], "last_error": row["last_error"],
            "created_at": _ts(row["created_at"]), "updated_at": _ts(row["updated_at"]),
            "delivered_at": _ts(row["delivered_at"])}


def failed_and_skipped() -> dict[str, dict[str, int]]:
    """Per project: failed deliveries, and skipped ones (a consumer disabled
    on purpose; not failures). Both read only rows in those states (partial
    indexes)."""
    out: dict[str, dict[str, int]] = {}
    for project_id, state, count in db.session.execute(text(
            "SELECT project_id, 'failed', count(*) FROM hook_deliveries WHERE state = 'failed' "
            "GROUP BY project_id UNION ALL "
            "SELECT c.project_id, 'skipped', count(*) FROM hook_deliveries d "
            "JOIN hook_consumers c ON c.id = d.consumer_id WHERE d.state = 'skipped' "
            "GROUP BY c.project_id")):
        out.setdefault(project_id, {})[state] = count
    return out


def list_deliveries(*, project_id=None, state=None, limit: int = 200) -> list[dict]:
    where, params = [], {"n": limit}
    if project_id:
        where.append("d.project_id = :p")
        params["p"] = project_id
    if state:
        where.append("d.state = :s")
        params["s"] = state
    rows = db.session.execute(text(
        "SELECT d.id, d.consumer_id, c.url, c.kind, d.project_id, d.attempt_id, d.asset_key, d.state, d.tries, "
        "d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at "
        "FROM hook_deliveries d JOIN hook_consumers c ON c.id = d.consumer_id "
        f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY d.id DESC LIMIT :n"),
        params).mappings().all()
    return [_delivery_dict(r) for r in rows]
