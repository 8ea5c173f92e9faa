"""Per-worker claim pacing (``worker_claim_qps``), kept on the client."""
from __future__ import annotations

import random
import threading
import time


class ClaimPacer:
    """Spaces claim starts at least ``1/qps`` apart.

    The first claim waits a random fraction of one interval (the initial
    phase), so that a fleet started at once does not claim in lockstep; each
    later interval is stretched by up to 10 % of jitter for the same reason.
    Jitter only ever lengthens an interval, so the pace is never exceeded.
    """

    JITTER = 0.10

    def __init__(self, qps: float | None = None, *, rng: random.Random | None = None,
                 clock=time.monotonic):
        self._rng = rng or random.Random()
        self._clock = clock
        self._qps: float | None = None
        self._next_at: float | None = None  # None: no claim made yet
        self._not_before = 0.0              # a pause the master asked for
        self.set_rate(qps)

    @property
    def qps(self) -> float | None:
        return self._qps

    def set_rate(self, qps: float | None) -> None:
        if qps == self._qps:
            return
        if self._next_at is not None and self._qps:
            # Re-space the pending claim with the new interval.
            self._next_at += self._interval(qps) - self._interval(self._qps)
        self._qps = qps

    def defer(self, seconds: float) -> None:
        """Start no claim before ``seconds`` from now."""
        self._not_before = max(self._not_before, self._clock() + max(0.0, seconds))

    def delay(self) -> float:
        """Seconds to wait before the next claim may start (no side effect)."""
        now = self._clock()
        wait = max(0.0, self._not_before - now)
        if self._qps:
            if self._next_at is None:
                self._next_at = now + self._rng.random() * self._interval(self._qps)
            wait = max(wait, self._next_at - now)
        return wait

    def started(self) -> None:
        """Record that a claim starts now; schedules the one after it."""
        if self._qps:
            stretch = 1.0 + self.JITTER * self._rng.random()
            self._next_at = self._clock() + self._interval(self._qps) * stretch

    def wait(self, stop: threading.Event) -> bool:
        """Sleep until a claim may start; False when ``stop`` was set meanwhile."""
        while (pause := self.delay()) > 0:
            if stop.wait(pause):
                return False
        return not stop.is_set()

    @staticmethod
    def _interval(qps: float | None) -> float:
        return 1.0 / qps if qps else 0.0
