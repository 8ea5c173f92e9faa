"""Ensure again: every archived asset gets a delivery for every enabled
consumer of its project, whenever the asset was archived.

The archive commit queues deliveries for the consumers enabled at that
moment (``deliveries.queue_for_asset``). The reconciler calls :func:`ensure`
every tick to close the gaps that path cannot see, in bounded batches:

- a consumer added after assets were archived: its cursor
  (``hook_consumers.backfilled_through``) walks the project's assets in
  archiving-attempt order and queues a delivery for each one without one;
- a consumer re-enabled after being disabled on purpose: its ``skipped``
  deliveries go back to pending (a fresh series of tries), and its cursor
  goes back to the first asset archived since it was disabled, so that the
  assets archived while it was off are found too (one index lookup per
  asset). Not further back: retention prunes old ``delivered`` rows, and an
  asset whose delivery was pruned must not be sent again.

An asset is identified by the attempt that archived it (``assets.attempt_id``);
the unique (consumer_id, attempt_id) index makes every step idempotent, so
two reconcilers racing, or a backfill racing the archive commit, queue one
delivery. Each new or revived delivery gets an outbox row, so it is re-driven
like any other.
"""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import db
from app import outbox

# Per consumer and tick: assets looked at, skipped deliveries revived.
BATCH = 500
# The hooks page counts missing deliveries among at most this many assets
# beyond the cursor ("10000+" beyond that), so it stays cheap mid-backfill.
PROGRESS_SCAN = 10_000


def ensure(batch: int = BATCH) -> dict:
    """One tick for every enabled consumer. Commits per consumer."""
    totals = {"backfilled": 0, "revived": 0}
    consumer_ids = db.session.execute(text(
        "SELECT id FROM hook_consumers WHERE enabled ORDER BY id")).scalars().all()
    db.session.commit()
    for consumer_id in consumer_ids:
        backfilled, revived = _ensure_one(consumer_id, batch)
        totals["backfilled"] += backfilled
        totals["revived"] += revived
    return totals


def _ensure_one(consumer_id: int, batch: int) -> tuple[int, int]:
    # One reconciler per consumer at a time; another one skips it this tick.
    consumer = db.session.execute(text(
        "SELECT project_id, backfilled_through FROM hook_consumers "
        "WHERE id = :c AND enabled FOR UPDATE SKIP LOCKED"), {"c": consumer_id}).first()
    if consumer is None:
        db.session.rollback()
        return 0, 0
    project_id, cursor = consumer
    revived = db.session.execute(text(
        "UPDATE hook_deliveries SET state = 'pending', tries = 0, last_error = NULL, "
        "updated_at = now() WHERE id IN ("
        "  SELECT id FROM hook_deliveries WHERE consumer_id = :c AND state = 'skipped' "
        "  ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED) RETURNING id"),
        {"c": consumer_id, "n": batch}).scalars().all()
    scanned = db.session.execute(text("""
        WITH batch AS (
            SELECT attempt_id, object_key FROM assets
            WHERE project_id = :p AND attempt_id > :k ORDER BY attempt_id LIMIT :n),
        queued AS (
            INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key)
            SELECT :c, :p, attempt_id, object_key FROM batch
            ON CONFLICT (consumer_id, attempt_id) DO NOTHING RETURNING id)
        SELECT (SELECT max(attempt_id) FROM batch), ARRAY(SELECT id FROM queued)"""),
        {"c": consumer_id, "p": project_id, "k": cursor, "n": batch}).first()
    through, queued = scanned
    if through is not None:
        db.session.execute(text(
            "UPDATE hook_consumers SET backfilled_through = :t WHERE id = :c"),
            {"t": through, "c": consumer_id})
    outbox.add_many("hook_delivery", list(revived) + list(queued))
    db.session.commit()
    return len(queued), len(revived)


def progress(consumer_ids: list[int]) -> dict[int, dict]:
    """Per consumer: assets of its project still lacking a delivery for it
    (counted among the next ``PROGRESS_SCAN`` assets beyond the cursor; the
    count is a lower bound when ``more`` is true) and skipped deliveries."""
    if not consumer_ids:
        return {}
    rows = db.session.execute(text("""
        SELECT c.id, m.missing, m.scanned, s.skipped
        FROM hook_consumers c
        CROSS JOIN LATERAL (
            SELECT count(*) FILTER (WHERE NOT EXISTS (
                       SELECT 1 FROM hook_deliveries d
                       WHERE d.consumer_id = c.id AND d.attempt_id = a.attempt_id)) AS missing,
                   count(*) AS scanned
            FROM (SELECT attempt_id FROM assets
                  WHERE project_id = c.project_id AND attempt_id > c.backfilled_through
                  ORDER BY attempt_id LIMIT :scan) a) m
        CROSS JOIN LATERAL (
            SELECT count(*) AS skipped FROM hook_deliveries d
            WHERE d.consumer_id = c.id AND d.state = 'skipped') s
        WHERE c.id = ANY(:ids)"""), {"ids": consumer_ids, "scan": PROGRESS_SCAN}).all()
    return {r[0]: {"missing": r[1], "more": r[2] >= PROGRESS_SCAN, "skipped": r[3]} for r in rows}
