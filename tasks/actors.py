"""Small actors; each calls one domain service."""
from __future__ import annotations

import logging

import dramatiq

log = logging.getLogger(__name__)


@dramatiq.actor(queue_name="maintenance", max_retries=3, time_limit=120_000)
def reap_leases():
    """Reset expired leases and fail jobs past their task deadline."""
    from app.projects import leasing
    swept = leasing.sweep()
    if any(swept.values()):
        log.info("swept leases: %s", swept)


@dramatiq.actor(queue_name="maintenance", max_retries=3, time_limit=120_000)
def fold_counters():
    """Collapse the counter delta rows so summaries stay cheap."""
    from app.projects import counters
    counters.fold()
