"""Give each actor a Flask app context (one app per worker process).

The app's outbox hints go back onto the broker that runs the actors, so a
worker's follow-up work (an archive's hook deliveries) lands in its own queues.
"""
from __future__ import annotations

import threading

import dramatiq


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

    def before_process_message(self, broker, message):
        ctx = self._get_app(broker).app_context()
        ctx.push()
        self._local.ctx = ctx
        from app import audit
        audit.acting_as("system")  # what the pipeline does on its own

    def _pop(self):
        ctx = getattr(self._local, "ctx", None)
        if ctx is not None:
            from app.extensions import db
            db.session.remove()
            ctx.pop()
            self._local.ctx = None

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self._pop()

    def after_skip_message(self, broker, message):
        self._pop()
