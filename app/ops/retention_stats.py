"""What retention pruned and what is kept, for the dashboard and ``/metrics``.

The numbers live in PostgreSQL (``retention_stats``, one row per kind)
because the prune actor, the web processes and the metrics scrape are
different processes. Table sizes are the planner's estimates
(``pg_class.reltuples``, or the statistics collector's count before the
first analyse): counting a table of millions of rows on every page view
would cost more than the page.
"""
from __future__ import annotations

from sqlalchemy import text

from app.extensions import db

# The tables retention keeps bounded, in the order the dashboard lists them.
TABLES = ("jobs", "attempts", "uploads", "outbox", "hook_deliveries", "page_sessions",
          "rate_limits", "worker_claim_buckets", "audit_log")


def cursor(kind: str) -> int:
    return db.session.execute(text("SELECT scan_cursor FROM retention_stats WHERE kind = :k"),
                              {"k": kind}).scalar() or 0


def set_cursor(kind: str, value: int) -> None:
    """Move a kind's scan position (caller commits, with the prune it belongs to)."""
    db.session.execute(text(
        "INSERT INTO retention_stats (kind, scan_cursor) VALUES (:k, :c) "
        "ON CONFLICT (kind) DO UPDATE SET scan_cursor = EXCLUDED.scan_cursor"),
        {"k": kind, "c": value})


def record(pruned: dict[str, int]) -> None:
    """Add one run's counts (a kind with 0 still gets its run time). Commits."""
    for kind, n in pruned.items():
        db.session.execute(text(
            "INSERT INTO retention_stats AS r (kind, pruned_total, last_pruned, last_run_at) "
            "VALUES (:k, :n, :n, now()) ON CONFLICT (kind) DO UPDATE SET "
            "pruned_total = r.pruned_total + EXCLUDED.last_pruned, "
            "last_pruned = EXCLUDED.last_pruned, last_run_at = now()"), {"k": kind, "n": int(n)})
    db.session.commit()


def pruned() -> dict[str, dict]:
    """``{kind: {"total", "last", "last_run_at"}}`` of every kind that has run."""
    rows = db.session.execute(text(
        "SELECT kind, pruned_total, last_pruned, last_run_at FROM retention_stats ORDER BY kind"))
    return {r.kind: {"total": int(r.pruned_total), "last": int(r.last_pruned),
                     "last_run_at": r.last_run_at} for r in rows}


def table_rows() -> dict[str, int]:
    """Estimated rows of each of :data:`TABLES`, read from the
    catalog only: ``reltuples`` once the table has been vacuumed or analysed,
    before that the statistics collector's live-row count."""
    rows = db.session.execute(text(
        "SELECT c.relname, c.reltuples, s.n_live_tup FROM pg_class c "
        "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
        "WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace "
        "AND c.relname = ANY(:names)"), {"names": list(TABLES)}).all()
    found = {name: (reltuples, live) for name, reltuples, live in rows}
    out = {}
    for table in TABLES:
        reltuples, live = found.get(table, (-1, None))
        analysed = reltuples is not None and reltuples >= 0
        out[table] = int(reltuples if analysed else live or 0)
    return out
