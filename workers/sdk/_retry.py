"""How long to wait before trying a request again."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of 429, 5xx and network errors; other 4xx are never retried.

    Parameters:
        attempts: tries per call in all, the first one included (>= 1).
        backoff_base_s: first backoff step; each retry doubles it.
        backoff_cap_s: largest backoff step.
        max_retry_after_s: a server asking for a longer pause than this gets
            the error raised at once instead of a sleeping caller.
    """
    attempts: int = 6
    backoff_base_s: float = 0.25
    backoff_cap_s: float = 10.0
    max_retry_after_s: float = 120.0

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff_base_s < 0 or self.backoff_cap_s < 0 or self.max_retry_after_s < 0:
            raise ValueError("delays must not be negative")

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds before retry number ``retry`` (0-based), with "equal
        jitter": 50..100 % of the step, so that workers that failed together
        do not come back together."""
        step = min(self.backoff_cap_s, self.backoff_base_s * (2 ** min(retry, 30)))
        return step * (0.5 + (rng or random).random() * 0.5)

    def pause(self, retry: int, retry_after_s: float | None = None, *, server_error: bool = False,
              rng: random.Random | None = None) -> float | None:
        """Seconds before retry number ``retry`` of a call the server may
        accept later, or None: its requested pause is longer than
        ``max_retry_after_s``, so waiting is the caller's decision, not ours.

        Without a hint it is the backoff. With one it is a little over the
        hint: the server is ready by then, and clients told the same instant
        spread out. A server error (``server_error``) keeps at least its backoff.
        """
        backoff = self.backoff(retry, rng)
        if retry_after_s is None:
            return backoff
        if retry_after_s > self.max_retry_after_s:
            return None
        return max(retry_after_s * (1.0 + 0.1 * (rng or random).random()),
                   backoff if server_error else 0.0)


# The policy of every worker-side client that retries: the SDK, the worker
# program's loops and hqctl.
DEFAULT = RetryPolicy()


def retry_after_s(envelope_ms, header: str | None) -> float | None:
    """The server's requested pause: the envelope's exact ``retry_after_ms``
    wins over ``Retry-After`` (whole seconds or an HTTP date)."""
    if isinstance(envelope_ms, int) and not isinstance(envelope_ms, bool) and envelope_ms >= 0:
        return envelope_ms / 1000.0
    if not header:
        return None
    header = header.strip()
    if header.isdigit():
        return float(header)
    try:
        when = parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
