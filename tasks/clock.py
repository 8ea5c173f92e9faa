"""The scheduler process (``python -m tasks.clock``; run as many as you like).

Sends the periodic messages. Sub-minute periods are needed (leases are
reaped every few seconds), so this is a small loop rather than cron syntax.

Clocks elect themselves: each holds, or keeps trying to take, a PostgreSQL
session advisory lock (:class:`Leadership`) on a direct connection of its
own (``LISTEN_DSN``: never through a transaction-mode pooler, which would
hand the session to someone else). Only the holder ticks; the others stand
by and try again every ``RETRY_S``. PostgreSQL drops the lock when the
holder's session ends — the process exits or is killed, its host or network
goes — so another clock takes over within ``RETRY_S`` of PostgreSQL noticing
(at once for a closed socket; a vanished host is noticed by TCP keepalives,
``KEEPALIVE_S``). The holder checks its connection every ``CHECK_S`` and
stops ticking the moment it is lost, so two clocks never tick for long at
once; a duplicate tick is harmless anyway (every periodic actor is
idempotent), a missing one only delays work.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

import dramatiq
import psycopg

from app.config import Defaults
from tasks import actors

log = logging.getLogger("fleethq.clock")

# Each periodic actor and the setting holding its period (app.config: the
# FLEETHQ_*_EVERY_S variables).
PERIODS = (
    (actors.reap_leases, "REAP_EVERY_S"),
    (actors.fold_counters, "FOLD_EVERY_S"),
    (actors.reconcile, "RECONCILE_EVERY_S"),
    (actors.sweep_spool, "SWEEP_SPOOL_EVERY_S"),
    (actors.prune_claim_buckets, "PRUNE_CLAIM_BUCKETS_EVERY_S"),
    (actors.prune_retention, "PRUNE_EVERY_S"),
)


def schedule(settings) -> tuple:
    """(actor, period in seconds) of every periodic actor, from the settings."""
    return tuple((actor, float(settings[key])) for actor, key in PERIODS)


SCHEDULE = schedule(vars(Defaults))  # the default periods


# Any 64-bit key of our own; the same in every clock of one database.
LOCK_KEY = 0x466C656574485143  # "FleetHQC"
RETRY_S = 1.0
CHECK_S = 1.0
KEEPALIVE_S = 5


class Leadership:
    """The clock lease: a session advisory lock held on a connection of its own."""

    def __init__(self, dsn: str, key: int = LOCK_KEY):
        self.dsn, self.key = dsn, key
        self._conn = None
        self.held = False

    def _connect(self):
        return psycopg.connect(self.dsn, autocommit=True, application_name="fleethq-clock",
                               connect_timeout=5, keepalives=1, keepalives_idle=KEEPALIVE_S,
                               keepalives_interval=KEEPALIVE_S, keepalives_count=2)

    def acquire(self) -> bool:
        """Take the lease if nobody holds it; True while this clock holds it."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            self.held = bool(self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0])
        except psycopg.Error as exc:
            log.warning("clock lease: database unreachable (%s)", exc.__class__.__name__)
            self.release()
        return self.held

    def still_held(self) -> bool:
        """Whether the session holding the lease is still alive."""
        try:
            self._conn.execute("SELECT 1")
            return True
        except (psycopg.Error, AttributeError):
            self.release()
            return False

    def release(self) -> None:
        """Give the lease up. Unlocked explicitly first: a closed connection's
        server session ends (and drops the lock) a moment after the client
        has moved on, and a clock that stops should hand over at once."""
        held, self.held = self.held, False
        if self._conn is not None:
            try:
                if held and not self._conn.closed:
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except psycopg.Error:
                pass  # the session is gone, and the lock with it
            try:
                self._conn.close()
            except psycopg.Error:
                pass
        self._conn = None


def run(schedule=SCHEDULE, stop=lambda: False, leadership: Leadership | None = None,
        sleep=None) -> None:
    """Tick while this clock holds the lease (always, without ``leadership``).
    ``sleep``: how to wait (a thread's clock waits on its stop event; by
    default ``time.sleep``, looked up at the call)."""
    sleep = sleep or time.sleep
    due = {actor.actor_name: 0.0 for actor, _ in schedule}
    checked = 0.0
    while not stop():
        if leadership is not None:
            if not leadership.held:
                if not leadership.acquire():
                    sleep(RETRY_S)
                    continue
                log.info("clock leading (pid %s)", os.getpid())
                due = {name: 0.0 for name in due}  # the last leader's ticks are unknown: tick now
            elif time.monotonic() - checked >= CHECK_S:
                checked = time.monotonic()
                if not leadership.still_held():
                    log.warning("clock lease lost: standing by")
                    continue
        now = time.monotonic()
        for actor, period in schedule:
            if now >= due[actor.actor_name]:
                try:
                    actor.send()
                except Exception as exc:  # Redis down: try again next period
                    log.warning("could not send %s: %s", actor.actor_name, exc)
                due[actor.actor_name] = now + period
        sleep(max(0.05, min(due.values()) - time.monotonic()))


class InWorker(dramatiq.Middleware):
    """The clock as a thread of a tasks worker process (``TASKS_CLOCK``).

    It stands for election like any clock process, on a connection of its
    own, so one clock ticks however many tasks processes (and clock
    processes) run; it stops, handing the lease over, when the worker shuts
    down. The smallest shape (web and one tasks process) then needs no clock
    process: about 70 MB less at rest (docs/deployment.md).
    """

    def __init__(self, settings):
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_worker_boot(self, broker, worker):
        self._thread = threading.Thread(target=self._run, name="fleethq-clock", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        leadership = Leadership(self.settings["LISTEN_DSN"])
        log.info("clock started in tasks (pid %s): waiting for the clock lease", os.getpid())
        try:
            run(schedule(self.settings), stop=self._stop.is_set, leadership=leadership, sleep=self._stop.wait)
        finally:
            leadership.release()

    def before_worker_shutdown(self, broker, worker):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _interrupt(*_):
    # A handler that only sets a flag is not enough: time.sleep() resumes
    # after it (PEP 475), so the clock would go on sleeping until its next
    # due message (5 s by default, longer with longer periods, past `docker
    # stop`'s 10 s grace). Raising ends the sleep at once; a send it cuts
    # short is a lost hint only, and main() releases the lease.
    raise KeyboardInterrupt


def main() -> None:
    from workers import logs
    logs.configure("clock")
    import tasks
    from app import config as app_config
    with app_config.reported():
        settings = app_config.load()
    tasks.setup_broker(settings)
    leadership = Leadership(settings["LISTEN_DSN"])
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        log.info("clock started (pid %s): waiting for the clock lease", os.getpid())
        run(schedule(settings), leadership=leadership)
    except KeyboardInterrupt:
        pass
    finally:
        leadership.release()


if __name__ == "__main__":
    main()
