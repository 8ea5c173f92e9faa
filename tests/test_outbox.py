"""The outbox's sender seam: hints leave only after commit, through the
sender ``create_app`` installed; the Dramatiq sender's topic table; a sender
that cannot reach Redis loses nothing (the row stays for the reconciler)."""
from __future__ import annotations

import logging

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from sqlalchemy import text

from app.extensions import db
from app import outbox
from tasks import actors
from tasks.sender import HANDLERS, DramatiqSender
from tests.conftest import free_port, make_app


def open_rows() -> list[tuple[str, int]]:
    return [tuple(r) for r in db.session.execute(text(
        "SELECT topic, ref FROM outbox WHERE done_at IS NULL ORDER BY id")).all()]


def test_hints_are_sent_after_commit_and_dropped_on_rollback(app, ctx, hints):
    outbox.add("archive_commit", 7)
    outbox.add_many("hook_delivery", [8, 9])
    outbox.add("archive_commit", 10, delay_s=60)  # due later: the reconciler sends it
    assert hints == []  # nothing leaves before the commit
    db.session.commit()
    assert hints == [("archive_commit", 7), ("hook_delivery", 8), ("hook_delivery", 9)]

    hints.clear()
    outbox.add("archive_commit", 11)
    db.session.rollback()
    db.session.commit()  # a later commit does not send the rolled-back hint
    assert hints == []
    assert open_rows() == [("archive_commit", 7), ("hook_delivery", 8), ("hook_delivery", 9),
                           ("archive_commit", 10)]


class Enqueued(dramatiq.Middleware):
    def __init__(self):
        self.messages = []

    def after_enqueue(self, broker, message, delay):
        self.messages.append((message.queue_name, message.actor_name, message.args))


def test_dramatiq_sender_sends_each_topic_to_its_actor():
    broker = StubBroker()
    broker.add_middleware(enqueued := Enqueued())
    sender = DramatiqSender(broker)
    sender.send("archive_commit", 3)
    sender.send("hook_delivery", 4)
    assert enqueued.messages == [("archive", "archive_commit", (3,)), ("hooks", "deliver_hook", (4,))]
    assert HANDLERS == {"archive_commit": actors.archive_commit, "hook_delivery": actors.deliver_hook,
                        "bulk_jobs": actors.bulk_jobs}
    broker.close()


def test_a_sender_that_cannot_reach_redis_is_logged_and_the_row_stays(
        app, ctx, monkeypatch, caplog):
    down = RedisBroker(url=f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setitem(app.extensions, outbox.SENDER_KEY, DramatiqSender(down))
    outbox.add("archive_commit", 5)
    with caplog.at_level(logging.WARNING, logger="app.outbox"):
        db.session.commit()  # the commit itself succeeds
    assert "could not send archive_commit 5" in caplog.text
    assert open_rows() == [("archive_commit", 5)]
    assert outbox.due() == [("archive_commit", 5)]  # what the reconciler re-sends
    down.close()


def test_create_app_chooses_the_sender(database_url):
    assert isinstance(outbox.sender_of(make_app(database_url, check_schema=False)),
                      outbox.RecordingSender)
    given = outbox.RecordingSender()
    from app import create_app
    chosen = create_app({"DATABASE_URL": database_url, "TESTING": True, "LOG_JSON": False},
                        check_schema=False)
    assert isinstance(outbox.sender_of(chosen), DramatiqSender)  # the production default
    assert outbox.sender_of(create_app({"DATABASE_URL": database_url, "LOG_JSON": False},
                                       check_schema=False, outbox_sender=given)) is given
    with pytest.raises(ValueError, match="OUTBOX_SENDER must be one of dramatiq, recording"):
        create_app({"DATABASE_URL": database_url, "OUTBOX_SENDER": "kafka"}, check_schema=False)
