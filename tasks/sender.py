"""The outbox's Dramatiq sender: which actor carries each outbox topic.

``create_app`` installs it as the app's outbox sender (``app.outbox``
only knows the ``Sender`` protocol). A hint is a message on the sender's
broker; a failure to enqueue (Redis down) is the outbox's to log and swallow,
since the reconciler re-sends the row from PostgreSQL.
"""
from __future__ import annotations

from tasks import actors
from workers import logs

# One row per outbox topic: the actor whose single argument is the row's ref.
HANDLERS = {
    "archive_commit": actors.archive_commit,
    "hook_delivery": actors.deliver_hook,
    "bulk_jobs": actors.bulk_jobs,
}


class DramatiqSender:
    """Enqueues each hint on ``broker`` as a message to the topic's actor."""

    def __init__(self, broker):
        self.broker = broker
        for actor in HANDLERS.values():
            broker.declare_queue(actor.queue_name)

    def send(self, topic: str, ref: int) -> None:
        # A hint sent while a request is served carries its id, so the task's
        # lines can be found from the request's (app/ops/logging.py binds it).
        request_id = logs.bound().get("request_id")
        options = {"request_id": request_id} if request_id else {}
        self.broker.enqueue(HANDLERS[topic].message_with_options(args=(ref,), **options))
