"""``/admin``: projects with counts and throughput, workers, backlog, recent
errors, and retention (what is kept, what was pruned).

The live part is also served alone (``/admin/live``) so that a small static
script can refresh it with ``fetch`` every few seconds without a full reload.
"""
from __future__ import annotations

from flask import current_app, render_template
from flask_babel import gettext as _

from app.hooks import deliveries
from app.ops import retention_stats
from app.pages import aggregates, charts
from app.pages.admin.base import bp
from app.projects import counters, service
from app.uploads import spool


def live_context() -> dict:
    stale_s = current_app.config["WORKER_STALE_S"]
    projects = service.list_summaries()
    ids = [p["id"] for p in projects]
    now, per_minute = aggregates.throughput(ids)
    waited = counters.oldest_queued_s(ids)
    for p in projects:
        p["oldest_queued_s"] = waited.get(p["id"])
        hour = {kind: per_minute[kind][p["id"]][-charts.HOUR:] for kind in aggregates.KINDS}
        p["claims_hour"], p["completions_hour"] = sum(hour["claims"]), sum(hour["completions"])
        p["failures_hour"] = sum(hour["failures"])
        p["sparkline"] = charts.sparkline(
            [charts.Series(charts.label(kind), values, charts.COLORS[kind]) for kind, values in hour.items()],
            title=_("%(project)s in the last hour: %(claims)s claims, %(completions)s completions, "
                    "%(failures)s failures", project=p["id"], claims=p["claims_hour"],
                    completions=p["completions_hour"], failures=p["failures_hour"]))
    overall = {kind: aggregates.total(per_minute[kind]) for kind in aggregates.KINDS}
    return {
        "projects": projects,
        "charts": charts.throughput(overall, now),
        "workers": aggregates.workers_summary(stale_s),
        "stale_after_s": stale_s,
        "backlog": aggregates.backlog(),
        "spool": _spool_fill(),
        "errors": aggregates.error_groups(),
        "hook_failures": deliveries.list_deliveries(state="failed", limit=10),
    }


# From here the dashboard warns: uploads past the quota get 507 until
# archive commits free room.
SPOOL_WARN_FRACTION = 0.8


def _spool_fill() -> dict:
    used, quota = spool.reserved_bytes(), int(current_app.config["SPOOL_MAX_BYTES"])
    fraction = used / quota if quota else 1.0
    return {"reserved": used, "max": quota, "percent": round(100 * fraction, 1),
            "warn": fraction >= SPOOL_WARN_FRACTION}


def _kept_for(days: int, what: str) -> str:
    return _("%(what)s after %(days)s days", what=what, days=days) if days else _("kept forever")


def retention_context() -> list[dict]:
    """One row per table: its rule, rows kept, and what the clock pruned."""
    cfg = current_app.config
    keep, outbox_days = cfg["KEEP_ATTEMPTS_PER_JOB"], cfg["KEEP_DONE_OUTBOX_DAYS"]
    rules = {
        "jobs": _kept_for(cfg["KEEP_FINISHED_JOBS_DAYS"], _("done, failed and exhausted jobs")),
        "attempts": (_("finished attempts beyond the newest %(keep)s per job", keep=keep) if keep
                     else _("kept forever")),
        "uploads": _("staged uploads fail after %(days)s days; receipts go with their attempt or job",
                     days=cfg["STAGED_RETENTION_S"] // 86400),
        "outbox": _kept_for(outbox_days, _("done rows")),
        "hook_deliveries": _kept_for(outbox_days, _("delivered and skipped deliveries")),
        "page_sessions": _("at expiry"),
        "rate_limits": _("when their window ends"),
        "worker_claim_buckets": _("after %(days)s days", days=cfg["CLAIM_BUCKET_RETENTION_DAYS"]),
        "audit_log": _kept_for(cfg["KEEP_AUDIT_DAYS"], _("audit rows")),
    }
    pruned = retention_stats.pruned()
    rows = []
    for table, kept in retention_stats.table_rows().items():
        stats = pruned.get(table)
        last_run = stats["last_run_at"] if stats else None
        rows.append({"table": table, "rule": rules[table], "rows": kept,
                     "last": stats["last"] if stats else None,
                     "total": stats["total"] if stats else None,
                     "last_run": last_run.timestamp() if last_run else None})
    return rows


@bp.get("")
def dashboard():
    return render_template("admin/dashboard.html", retention=retention_context(), **live_context())


@bp.get("/live")
def dashboard_live():
    return render_template("admin/_dashboard_live.html", **live_context())
