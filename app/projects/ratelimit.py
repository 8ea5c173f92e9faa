"""The project dispatch token bucket (DESIGN §5), as plain arithmetic.

Capacity is one token up to 1000 qps; above that ``min(qps / 10, 256)``,
i.e. at most 100 ms of work. Each claimed job takes one token. All values are
floats; at absurd rates (1e300 qps) refills overflow to ``inf`` and are capped
by the capacity, so nothing raises.
"""
from __future__ import annotations

import math

# Float refills land a hair under whole numbers (0.4 s × 2.5 qps); treat
# anything within this of the next token as that token.
EPSILON = 1e-9


def capacity(qps: float) -> float:
    return 1.0 if qps <= 1000 else min(qps / 10.0, 256.0)


def refill(tokens: float, elapsed_s: float, qps: float) -> float:
    gained = max(0.0, elapsed_s) * qps
    return min(capacity(qps), tokens + gained)


def grantable(tokens: float, want: int) -> int:
    return max(0, min(want, math.floor(tokens + EPSILON)))


# Absurdly small rates (1e-300 qps) would ask clients to wait ~1e303 ms, which
# overflows any int64 reader; a day is the longest wait we ever announce.
MAX_RETRY_AFTER_MS = 86_400_000


def retry_after_ms(tokens: float, qps: float) -> int:
    """Milliseconds until the bucket holds one whole token again (1 .. a day)."""
    deficit = max(0.0, 1.0 - tokens)
    wait = deficit * 1000.0 / qps - EPSILON
    if wait >= MAX_RETRY_AFTER_MS:
        return MAX_RETRY_AFTER_MS
    return max(1, math.ceil(wait))
