"""The renewal thread: one per queue, renewing every live job's lease every
quarter lease, in batches of at most 256 items per request."""
from __future__ import annotations

import threading
import time
from itertools import groupby
from typing import TYPE_CHECKING

from workers.sdk._errors import APIError, FleetHQError

if TYPE_CHECKING:
    from workers.sdk._jobs import Job

BATCH = 256
# Jobs due within this share of a quarter lease ride along with a due batch,
# so a claim's jobs keep being renewed together instead of one by one.
_SLACK = 0.25
_MAX_RETRY_PAUSE_S = 1.0


class Renewer:
    """Tracks live jobs and renews them from a daemon thread.

    The thread starts with the first tracked job and stops in :meth:`close`,
    which also interrupts any retry pause of a renewal in flight.
    """

    def __init__(self, extend, *, name: str):
        self._extend = extend  # (jobs, seconds, interrupt, deadline) -> [ItemResult]
        self._name = name
        self._cv = threading.Condition()
        self._jobs: dict[str, Job] = {}   # attempt id -> Job
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def track(self, jobs) -> None:
        with self._cv:
            if self._stop.is_set():
                raise FleetHQError("queue is closed")
            for job in jobs:
                self._jobs[job.info.attempt_id] = job
            if self._thread is None and self._jobs:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()

    def forget(self, job) -> None:
        with self._cv:
            self._jobs.pop(job.info.attempt_id, None)

    def close(self) -> list:
        """Stop and join the thread; return the jobs still held."""
        with self._cv:
            self._stop.set()
            held = list(self._jobs.values())
            self._jobs.clear()
            self._cv.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        return held

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stop.is_set():
                        return
                    due, expired, wait = self._pick(time.monotonic())
                    if due or expired:
                        break
                    self._cv.wait(wait)
            for job in expired:
                job.lose("the lease ran out before a renewal got through")
            for seconds, group in groupby(sorted(due, key=lambda j: j.lease_seconds),
                                          key=lambda j: j.lease_seconds):
                jobs = list(group)
                for start in range(0, len(jobs), BATCH):
                    if self._stop.is_set():
                        return
                    self._renew(jobs[start:start + BATCH], seconds)

    def _pick(self, now: float):
        due, expired, wake = [], [], None
        for job in self._jobs.values():
            renew_at, expires_at, reporting = job.schedule()
            if expires_at <= now and not reporting:
                expired.append(job)
                continue
            slack = job.lease_seconds / 4.0 * _SLACK
            if renew_at <= now + slack:
                due.append(job)
            nearest = min(renew_at, expires_at)
            wake = nearest if wake is None else min(wake, nearest)
        for job in expired:
            self._jobs.pop(job.info.attempt_id, None)
        return due, expired, None if wake is None else max(0.0, wake - now)

    def _renew(self, jobs: list, seconds: int) -> None:
        sent = time.monotonic()
        # Retrying past the first expiry in the batch would only delay
        # telling that job's worker its lease is gone.
        deadline = min(job.schedule()[1] for job in jobs)
        try:
            results = self._extend(jobs, seconds, self._stop, deadline)
        except APIError as exc:
            if exc.status == 429 or exc.status >= 500:
                self._later(jobs, seconds)
                return
            # Refused for good (revoked token, version dropped, project gone):
            # these leases cannot be kept alive.
            for job in jobs:
                job.lose(f"renewal refused: {exc.code}")
            return
        except FleetHQError:
            # Network down or a garbled answer: try again soon; the expiry
            # check cancels the jobs if it never gets through.
            self._later(jobs, seconds)
            return
        for job, result in zip(jobs, results):
            job.renewed(result, seconds, sent)

    def _later(self, jobs: list, seconds: int) -> None:
        pause = min(_MAX_RETRY_PAUSE_S, seconds / 8.0)
        for job in jobs:
            job.retry_renewal_at(time.monotonic() + pause)
