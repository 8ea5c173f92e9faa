"""Is this worker the problem? (issue "Polite at fleet scale" §4)

A worker whose own network or disk is gone fails every fetch at full speed,
and each failure would cost its job a reset: one bad worker could fail the
whole queue. So a failure that may be the worker's own fault — a DNS
lookup or a connection that failed, a time-out, a full disk — is *held*:
its report waits (in the journal, ``hold_since``) for a verdict.

- A fetch that succeeds clears the suspicion: the held failures were the
  sites' and are reported as they are.
- ``TRIP_STREAK`` suspect failures in a row from at least two servers (or
  one full disk) convict the worker: the held reports become
  ``worker_unfit`` (the master puts those jobs back at once without a reset,
  workers.wire.failures), and the worker stops claiming for a pause that
  doubles with each conviction (``BACKOFF_FIRST_S`` .. ``BACKOFF_MAX_S``).
  Its heartbeat offers no slot meanwhile and says why.
- Fetches that were running when it was convicted end as theirs too.
  After a pause it *probes*: one fetch at a time; one more suspect failure
  convicts it again (a longer pause), a success ends the matter.
- A held failure without a verdict after ``HOLD_S`` is reported as it is
  (delivery.py): a lone failure of a site that is down is the site's.
"""
from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlsplit

log = logging.getLogger("fleethq.worker")

TRIP_STREAK = 3
HOLD_S = 30.0
BACKOFF_FIRST_S = 30.0
BACKOFF_MAX_S = 900.0
# Failures that the network under the worker explains as well as the site.
_SUSPECT_REASONS = ("dns", "connection")


def suspect_server(code: str, details: dict) -> str | None:
    """The server a failure might blame on this worker, or None when it is
    the job's or the site's (an HTTP answer, a refused address, a bad PDF)."""
    if code == "disk":
        return "disk"
    if details.get("blocked"):
        return None
    if code == "timeout" or (code == "network" and details.get("reason") in _SUSPECT_REASONS):
        host = details.get("host")
        if host:
            return str(host)
        try:
            return urlsplit(str(details.get("url") or details.get("target_url") or "")).netloc or "?"
        except ValueError:
            return "?"
    return None


class Fitness:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._held: list[tuple[str, str]] = []   # (attempt, server) of the current streak
        self.convictions = 0
        self.until = 0.0
        self.reason: str | None = None
        self.probing = False

    def failed(self, attempt_id: str, code: str, details: dict) -> tuple[bool, list[str]]:
        """A fetch failed. Returns (hold this report?, the held attempts now
        convicted as the worker's fault, this one included)."""
        server = suspect_server(code, details)
        if server is None:
            return False, []
        with self._lock:
            self._held.append((attempt_id, server))
            servers = {s for _, s in self._held}
            standing = self.reason is not None      # convicted, no success since
            if not (code == "disk" or standing
                    or (len(self._held) >= TRIP_STREAK and len(servers) >= 2)):
                return True, []
            convicted = [a for a, _ in self._held]
            self._held = []
            if standing and self._clock() < self.until:
                return True, convicted              # a fetch started before the pause: no new pause
            self.convictions += 1
            pause = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.convictions - 1))
            self.until = self._clock() + pause
            self.probing = False
            self.reason = ("its disk is full" if code == "disk" else
                           f"{len(convicted)} fetches in a row failed to reach "
                           f"{len(servers)} servers ({code}: the network under this worker?)")
        log.warning("this worker backs off for %.0f s and stops claiming: %s", pause, self.reason)
        return True, convicted

    def succeeded(self) -> list[str]:
        """A fetch succeeded: the held failures were the sites'. Returns them."""
        with self._lock:
            released = [a for a, _ in self._held]
            self._held = []
            if self.convictions or self.probing:
                log.info("a fetch succeeded: this worker claims as usual again")
            self.convictions, self.probing, self.reason = 0, False, None
        return released

    def paused(self) -> str | None:
        """Why this worker must not claim now, or None. When a pause ends
        the worker probes: one fetch at a time until one succeeds."""
        with self._lock:
            if self.reason is None:
                return None
            left = self.until - self._clock()
            if left > 0:
                return f"backing off {left:.0f} s: {self.reason}"
            self.probing = True
            return None

    def slots(self, concurrency: int) -> int:
        """Fetch slots the claim may fill: one while probing."""
        return 1 if self.probing else concurrency
