"""Give each actor a Flask app context (one app per worker process).

The app's outbox hints go back onto the broker that runs the actors, so a
worker's follow-up work (an archive's hook deliveries) lands in its own queues.
"""
from __future__ import annotations

import logging
import threading
import time

import dramatiq

from workers import logs

log = logging.getLogger("fleethq.tasks")


class AppContext(dramatiq.Middleware):
    def __init__(self):
        self._app = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def _get_app(self, broker):
        with self._lock:
            if self._app is None:
                from app import create_app
                from tasks.sender import DramatiqSender
                self._app = create_app(outbox_sender=DramatiqSender(broker))
            return self._app

    def before_worker_boot(self, broker, worker):
        # Dramatiq set up a handler that pipes each line to its parent: the
        # lines keep that way and take FleetHQ's one format (workers/logs.py).
        logs.configure("tasks", adopt=("",))

    def before_process_message(self, broker, message):
        # The request whose outbox hint this is (tasks/sender.py), on every
        # line the task logs.
        logs.bind(actor=message.actor_name, message_id=message.message_id)
        if message.options.get("request_id"):
            logs.bind(request_id=message.options["request_id"])
        self._local.started = time.perf_counter()
        ctx = self._get_app(broker).app_context()
        ctx.push()
        self._local.ctx = ctx
        from app import audit
        audit.acting_as("system")  # what the pipeline does on its own

    def _pop(self):
        logs.clear()
        ctx = getattr(self._local, "ctx", None)
        if ctx is not None:
            from app.extensions import db
            db.session.remove()
            ctx.pop()
            self._local.ctx = None

    def after_process_message(self, broker, message, *, result=None, exception=None):
        started = getattr(self._local, "started", None)
        if started is not None:
            log.debug("task finished", extra={"ok": exception is None,
                                              "duration_ms": round((time.perf_counter() - started) * 1000, 1)})
        self._pop()

    def after_skip_message(self, broker, message):
        self._pop()
