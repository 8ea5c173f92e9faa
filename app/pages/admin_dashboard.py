"""``/admin``: projects with counts and throughput, workers, backlog, recent errors.

The live part is also served alone (``/admin/live``) so that a small static
script can refresh it with ``fetch`` every few seconds without a full reload.
"""
from __future__ import annotations

from flask import current_app, render_template

from app.hooks import deliveries
from app.pages import aggregates, charts
from app.pages.admin import bp
from app.projects import service


def live_context() -> dict:
    stale_s = current_app.config["WORKER_STALE_S"]
    projects = service.list_summaries()
    ids = [p["id"] for p in projects]
    _, per_minute = aggregates.throughput(ids)
    for p in projects:
        claims = per_minute["claims"][p["id"]][-charts.HOUR:]
        completions = per_minute["completions"][p["id"]][-charts.HOUR:]
        p["claims_hour"], p["completions_hour"] = sum(claims), sum(completions)
        p["sparkline"] = charts.sparkline(
            [charts.Series("claims", claims, charts.COLORS["claims"]),
             charts.Series("completions", completions, charts.COLORS["completions"])],
            title=f"{p['id']}: {sum(claims)} claims, {sum(completions)} completions in the last hour")
    overall = {kind: aggregates.total(per_minute[kind]) for kind in aggregates.KINDS}
    return {
        "projects": projects,
        "charts": charts.throughput(overall),
        "workers": aggregates.workers_summary(stale_s),
        "stale_after_s": stale_s,
        "backlog": aggregates.backlog(),
        "failures": aggregates.recent_failures(10),
        "hook_failures": deliveries.list_deliveries(state="failed", limit=10),
    }


@bp.get("")
def dashboard():
    return render_template("admin/dashboard.html", **live_context())


@bp.get("/live")
def dashboard_live():
    return render_template("admin/_dashboard_live.html", **live_context())
