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


@dramatiq.actor(queue_name="maintenance", max_retries=3, time_limit=120_000)
def prune_claim_buckets():
    """Drop per-worker claim audit rows older than their retention."""
    from flask import current_app

    from app.ops import retention_stats
    from app.projects import claim_audit
    pruned = claim_audit.prune(int(current_app.config["CLAIM_BUCKET_RETENTION_DAYS"]))
    retention_stats.record({"worker_claim_buckets": pruned})


@dramatiq.actor(queue_name="maintenance", max_retries=3, time_limit=300_000)
def prune_retention():
    """Prune finished rows past their retention, one bounded batch per kind."""
    from flask import current_app

    from app.ops import retention
    pruned = retention.run(current_app.config)
    if any(pruned.values()):
        log.info("pruned: %s", pruned)


def _store():
    from flask import current_app

    from app.storage import shared_store
    return shared_store(current_app.config)


@dramatiq.actor(queue_name="archive", max_retries=0, time_limit=15 * 60_000)
def archive_commit(attempt_id: int):
    """Archive one staged upload; on failure its outbox row is pushed back."""
    from app.uploads import archive
    archive.commit(int(attempt_id), _store())


@dramatiq.actor(queue_name="hooks", max_retries=0, time_limit=120_000)
def deliver_hook(delivery_id: int):
    """POST one webhook delivery; retries are scheduled through the outbox."""
    from flask import current_app

    from app.config import outbound_networks
    from app.hooks import deliveries
    from app.uploads import downloads
    store, config = _store(), current_app.config
    deliveries.deliver(int(delivery_id), lambda key: downloads.url_for(store, config, key),
                       secret_key=config["SECRET_KEY"], public_url=config.get("PUBLIC_URL"),
                       allow=outbound_networks(config))


@dramatiq.actor(queue_name="maintenance", max_retries=0, time_limit=120_000)
def bulk_jobs(action_id: int):
    """One slice of an admin's bulk requeue or delete; queues the next itself."""
    from app.projects import bulk
    bulk.run(int(action_id))


@dramatiq.actor(queue_name="maintenance", max_retries=0, time_limit=120_000)
def reconcile():
    """Re-send every outbox row that is due (Redis messages are only hints;
    this includes 202 deliveries past their completion timeout), then
    "ensure again": queue deliveries that archived assets lack for enabled
    consumers (a bounded backfill) and revive those of re-enabled ones;
    seal hook signing secrets still kept in clear."""
    from flask import current_app

    from app import outbox
    from app.hooks import backfill, consumers
    for topic, ref in outbox.due():
        outbox.send_hint(topic, ref)
    ensured = backfill.ensure()
    if any(ensured.values()):
        log.info("hook deliveries ensured: %s", ensured)
    sealed = consumers.seal_clear_secrets(current_app.config)
    if sealed:
        log.info("hook signing secrets sealed: %d", sealed)


@dramatiq.actor(queue_name="maintenance", max_retries=3, time_limit=300_000)
def sweep_spool():
    """Expire abandoned and over-retention uploads and remove orphan spool files."""
    from flask import current_app

    from app.uploads import sweeper
    swept = sweeper.sweep(current_app.config)
    if any(swept.values()):
        log.info("swept spool: %s", swept)
