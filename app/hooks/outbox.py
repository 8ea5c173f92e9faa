"""The outbox: durable "do this after commit" rows, relayed to Dramatiq.

``add`` writes a row in the caller's transaction and remembers a hint; the
hint is sent only after that transaction commits (a session event). If Redis
is down or the hint is lost, the reconciler re-sends every due row from
PostgreSQL, so work is delayed, never lost.
"""
from __future__ import annotations

import logging

from sqlalchemy import event, text
from sqlalchemy.orm import Session

from app.extensions import db

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 3600


def add(topic: str, ref: int, *, delay_s: float = 0.0) -> None:
    db.session.execute(text(
        "INSERT INTO outbox (topic, ref, due_at) VALUES (:t, :r, now() + make_interval(secs => :d)) "
        "ON CONFLICT (topic, ref) WHERE done_at IS NULL DO NOTHING"), {"t": topic, "r": ref, "d": delay_s})
    if delay_s <= 0:
        db.session.info.setdefault("outbox_hints", []).append((topic, ref))


def done(topic: str, ref: int) -> None:
    db.session.execute(text(
        "UPDATE outbox SET done_at = now() WHERE topic = :t AND ref = :r AND done_at IS NULL"),
        {"t": topic, "r": ref})


def retry_later(topic: str, ref: int, error: str) -> int:
    """Push the row back with exponential backoff; returns the tries so far."""
    return db.session.execute(text(
        "UPDATE outbox SET tries = tries + 1, last_error = :e, due_at = now() + make_interval("
        "secs => LEAST(:cap, 5 * power(2, LEAST(tries, 12)))) "
        "WHERE topic = :t AND ref = :r AND done_at IS NULL RETURNING tries"),
        {"t": topic, "r": ref, "e": error[:2000], "cap": MAX_BACKOFF_S}).scalar() or 0


# A re-sent row is not due again for this long: its hint is queued or being
# worked on, and re-sending every reconcile tick would pile up duplicates.
RESEND_LEASE_S = 120


def due(limit: int = 500) -> list[tuple[str, int]]:
    """Claim the rows that are due for a re-send (pushing them back by the
    re-send lease). Commits."""
    rows = db.session.execute(text(
        "UPDATE outbox SET due_at = now() + make_interval(secs => :lease) WHERE id IN ("
        "  SELECT id FROM outbox WHERE done_at IS NULL AND due_at <= now() "
        "  ORDER BY due_at LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING topic, ref"),
        {"n": limit, "lease": RESEND_LEASE_S}).all()
    db.session.commit()
    return [(r[0], r[1]) for r in rows]


def send_hint(topic: str, ref: int) -> None:
    try:
        from tasks import actors
        actor = {"archive_commit": actors.archive_commit, "hook_delivery": actors.deliver_hook}[topic]
        actor.send(ref)
    except Exception as exc:  # Redis down: the reconciler will find the row
        log.warning("could not send %s %s: %s", topic, ref, exc.__class__.__name__)


@event.listens_for(Session, "after_commit")
def _send_after_commit(session):
    hints = session.info.pop("outbox_hints", None)
    for topic, ref in hints or ():
        send_hint(topic, ref)


@event.listens_for(Session, "after_rollback")
def _drop_on_rollback(session):
    session.info.pop("outbox_hints", None)
