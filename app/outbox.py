"""The outbox: durable "do this after commit" rows, relayed by a sender.

``add`` writes a row in the caller's transaction and remembers a hint; the
hint is sent only after that transaction commits (a session event) and
dropped on rollback. If the sender fails (Redis down) or the hint is lost,
the reconciler re-sends every due row from PostgreSQL, so work is delayed,
never lost.

Who carries a hint is the app's choice, not this module's: ``create_app``
installs a ``Sender`` (the Dramatiq one of ``tasks.sender`` in production,
``RecordingSender`` in tests), so domain code never reaches into the tasks
package.
"""
from __future__ import annotations

import logging
import threading
from typing import Protocol

from flask import Flask, current_app
from sqlalchemy import event, text

from app.extensions import db

log = logging.getLogger(__name__)
SENDER_KEY = "fleethq.outbox_sender"


class Sender(Protocol):
    """Carries one hint: "the outbox row (topic, ref) is due". It may raise
    (a broker that is down); ``send_hint`` logs and swallows that."""

    def send(self, topic: str, ref: int) -> None: ...


class RecordingSender:
    """Sends nothing and remembers every hint, in order (tests assert what
    was hinted; nothing reaches a shared queue)."""

    def __init__(self):
        self.sent: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def send(self, topic: str, ref: int) -> None:
        with self._lock:
            self.sent.append((topic, ref))


def install(app: Flask, sender: Sender) -> None:
    """Give ``app`` its sender; hints go out after the app's session commits.

    The listeners sit on the app's session (Flask-SQLAlchemy's ``db.session``)
    rather than on every SQLAlchemy session of the process; one pair serves
    every app, each hint going to the sender of the app it was made in.
    """
    app.extensions[SENDER_KEY] = sender
    for name, listener in (("after_commit", _send_after_commit), ("after_rollback", _drop_on_rollback)):
        if not event.contains(db.session, name, listener):
            event.listen(db.session, name, listener)


def sender_of(app: Flask) -> Sender:
    return app.extensions[SENDER_KEY]
MAX_BACKOFF_S = 3600


def add(topic: str, ref: int, *, delay_s: float = 0.0) -> None:
    db.session.execute(text(
        "INSERT INTO outbox (topic, ref, due_at) VALUES (:t, :r, now() + make_interval(secs => :d)) "
        "ON CONFLICT (topic, ref) WHERE done_at IS NULL DO NOTHING"), {"t": topic, "r": ref, "d": delay_s})
    if delay_s <= 0:
        db.session.info.setdefault("outbox_hints", []).append((topic, ref))


def add_many(topic: str, refs: list[int]) -> None:
    """``add`` for a batch of refs, due now, in one statement."""
    if not refs:
        return
    db.session.execute(text(
        "INSERT INTO outbox (topic, ref) SELECT :t, unnest(CAST(:refs AS bigint[])) "
        "ON CONFLICT (topic, ref) WHERE done_at IS NULL DO NOTHING"), {"t": topic, "refs": refs})
    db.session.info.setdefault("outbox_hints", []).extend((topic, ref) for ref in refs)


def defer(topic: str, ref: int, wait_s: float) -> None:
    """Keep (or open) the row, due only after ``wait_s``, with no hint and no
    added try: a look again later, not a failure."""
    moved = db.session.execute(text(
        "UPDATE outbox SET due_at = now() + make_interval(secs => :w) "
        "WHERE topic = :t AND ref = :r AND done_at IS NULL"), {"t": topic, "r": ref, "w": wait_s}).rowcount
    if not moved:
        add(topic, ref, delay_s=wait_s)


def done(topic: str, ref: int) -> None:
    db.session.execute(text(
        "UPDATE outbox SET done_at = now() WHERE topic = :t AND ref = :r AND done_at IS NULL"),
        {"t": topic, "r": ref})


def _push_back(topic: str, ref: int, error: str, after_s: float):
    return db.session.execute(text(
        "UPDATE outbox SET tries = tries + 1, last_error = :e, due_at = now() + make_interval("
        "secs => :after + LEAST(:cap, 5 * power(2, LEAST(tries, 12)))) "
        "WHERE topic = :t AND ref = :r AND done_at IS NULL RETURNING tries, due_at"),
        {"t": topic, "r": ref, "e": error[:2000], "cap": MAX_BACKOFF_S, "after": after_s}).first()


def retry_later(topic: str, ref: int, error: str) -> int:
    """Push the row back with exponential backoff; returns the tries so far."""
    row = _push_back(topic, ref, error, 0.0)
    return row[0] if row is not None else 0


def wait_then_retry(topic: str, ref: int, note: str, wait_s: float):
    """Keep the row open but due only after ``wait_s`` plus the backoff of its
    tries (a 202 answer waiting for its callback); returns the due time."""
    row = _push_back(topic, ref, note, wait_s)
    if row is not None:
        return row[1]
    return db.session.execute(text(  # no open row (sent by hand): open one
        "INSERT INTO outbox (topic, ref, due_at, last_error) "
        "VALUES (:t, :r, now() + make_interval(secs => :w), :e) RETURNING due_at"),
        {"t": topic, "r": ref, "w": wait_s, "e": note}).scalar()


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
    """Hand one hint to the current app's sender."""
    try:
        sender_of(current_app).send(topic, ref)
    except Exception as exc:  # Redis down: the reconciler will find the row
        log.warning("could not send %s %s: %s", topic, ref, exc.__class__.__name__)


def _send_after_commit(session):
    hints = session.info.pop("outbox_hints", None)
    for topic, ref in hints or ():
        send_hint(topic, ref)


def _drop_on_rollback(session):
    session.info.pop("outbox_hints", None)
