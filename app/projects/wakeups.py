"""Wake long-polling claimers when jobs become claimable.

Writers call :func:`notify` inside their transaction; PostgreSQL delivers the
``NOTIFY`` at commit. Each web process runs one listener thread on its own
connection and bumps a per-project generation counter; a waiting request
sleeps on a condition variable until the generation moves or its deadline
passes, so an idle long-poll costs no database queries.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from sqlalchemy import text

from app.extensions import db

CHANNEL = "fleethq_jobs"
log = logging.getLogger(__name__)
T = TypeVar("T")


def notify(project_id: str) -> None:
    db.session.execute(text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": project_id})


class Listener:
    """One LISTEN connection per process, started on first use."""

    # While the listener is down, waiters re-check this often instead of
    # sleeping through a wake-up they cannot hear.
    DEGRADED_SLICE_S = 1.0

    def __init__(self, dsn: str):
        self._dsn = dsn
        self._cond = threading.Condition()
        self._generations: dict[str, int] = {}
        # Bumped on every (re)connect: notifications sent while disconnected are
        # lost, so every waiter must look at the database again.
        self._epoch = 0
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._start_lock = threading.Lock()
        self._stopping = False
        _started.append(self)

    def generation(self, project_id: str) -> tuple[int, int]:
        self.start()
        with self._cond:
            return self._epoch, self._generations.get(project_id, 0)

    def wait(self, project_id: str, seen: tuple[int, int], timeout_s: float) -> bool:
        """Sleep until ``project_id`` was notified after generation ``seen``.

        Returns True when woken by a notification.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._epoch, self._generations.get(project_id, 0)) == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if not self._connected.is_set():
                    left = min(left, self.DEGRADED_SLICE_S)
                    self._cond.wait(left)
                    if not self._connected.is_set():
                        return True  # let the caller look at the database itself
                    continue
                self._cond.wait(left)
            return True

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="fleethq-listen", daemon=True)
            self._thread.start()
            # Give the first LISTEN a moment so the first waiter hears everything.
            self._connected.wait(2.0)

    def _run(self) -> None:
        while True:
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._connected.set()
                    self._bump_all()  # anything may have happened while we were away
                    for note in conn.notifies():
                        self._bump(note.payload)
            except Exception as exc:  # reconnect; waiters fall back to short slices
                if self._stopping:
                    return  # shutting down: the lost connection is expected
                self._connected.clear()
                with self._cond:
                    self._cond.notify_all()  # sleepers switch to degraded re-checks now
                log.warning("listener connection lost: %s", exc.__class__.__name__)
                time.sleep(1.0)

    def _bump(self, project_id: str) -> None:
        with self._cond:
            self._generations[project_id] = self._generations.get(project_id, 0) + 1
            self._cond.notify_all()

    def _bump_all(self) -> None:
        with self._cond:
            self._epoch += 1
            self._cond.notify_all()


_listener: Listener | None = None
_listener_lock = threading.Lock()
_started: list[Listener] = []


def stop() -> None:
    """At shutdown (before the database goes away): every listener stops
    reconnecting and ends quietly when its connection does."""
    for each in _started:
        each._stopping = True


def listener(dsn: str) -> Listener:
    global _listener
    with _listener_lock:
        if _listener is None or _listener._dsn != dsn:
            _listener = Listener(dsn)
        return _listener


def long_poll(dsn: str, key: str, wait_s: float, look: Callable[[bool], T], *,
              done: Callable[[T], bool],
              wake_hint: Callable[[T], float | None] = lambda _answer: None) -> tuple[T, bool]:
    """Look until the answer is ``done`` or ``wait_s`` has passed, sleeping
    between looks until ``key`` is notified (or ``wake_hint`` seconds, when
    something becomes ready without a notice: a backoff ending, a lease
    running out).

    ``look(waited)`` is told whether it follows a sleep. The session's
    transaction is committed before each sleep: a waiting request holds no
    database connection. Returns the last answer and whether it slept.
    """
    if wait_s <= 0:
        return look(False), False  # no wait asked for: one look
    deadline = time.monotonic() + wait_s
    listening = listener(dsn)
    waited = False
    while True:
        seen = listening.generation(key)
        answer = look(waited)
        left = deadline - time.monotonic()
        if done(answer) or left <= 0:
            return answer, waited
        hint = wake_hint(answer)
        db.session.commit()
        # A little past the hint: wake after the thing it names, not just before.
        listening.wait(key, seen, min(left, hint if hint is not None else left) + 0.005)
        waited = True
