"""``/metrics`` in Prometheus text format.

Job and attempt counters come from PostgreSQL (the trigger-maintained delta
tables), so they are right however many gunicorn workers and task processes
there are. Request latency is measured in-process with prometheus_client;
under gunicorn its multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) merges the
workers' files.
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import time

from flask import Response, current_app, g, request
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sqlalchemy import text

from app.config import metrics_networks
from app.extensions import db
from app.hooks import deliveries
from app.ops import retention, retention_stats
from app.projects import counters
from app.sites import service as sites
from app.uploads import spool

REQUEST_LATENCY = Histogram(
    "fleethq_http_request_duration_seconds", "HTTP request latency",
    ["method", "endpoint", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

# How many of a worker's plain requests each hot-path statement served
# (app.api.hot_batches): above 1 when requests arriving together shared one.
HOT_PATH_BATCH = Histogram(
    "fleethq_hot_path_requests_per_statement", "Plain worker requests served by one hot-path statement",
    ["route"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))

# attempt state → (metric, help)
_ATTEMPT_METRICS = {
    "running": ("fleethq_claims_total", "Jobs handed to workers (attempts created)"),
    "done": ("fleethq_completions_total", "Attempts completed"),
    "failed": ("fleethq_failures_total", "Attempts reported failed"),
    "expired": ("fleethq_lease_expiries_total", "Attempts whose lease or deadline ran out"),
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_queue_metrics() -> str:
    lines = []
    totals = counters.attempt_totals()
    for state, (name, help_text) in _ATTEMPT_METRICS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for project_id, by_state in sorted(totals.items()):
            lines.append(f'{name}{{project="{_label(project_id)}"}} {by_state.get(state, 0)}')
    lines += ["# HELP fleethq_jobs Jobs per project and state",
              "# TYPE fleethq_jobs gauge"]
    project_ids = list(db.session.execute(text("SELECT id FROM projects ORDER BY id")).scalars())
    job_counts = counters.job_counts(project_ids)  # zeros for projects without jobs
    for project_id, by_state in sorted(job_counts.items()):
        for state, count in by_state.items():
            lines.append(f'fleethq_jobs{{project="{_label(project_id)}",state="{state}"}} {count}')
    lines += ["# HELP fleethq_queue_depth Jobs waiting to be claimed",
              "# TYPE fleethq_queue_depth gauge"]
    for project_id, by_state in sorted(job_counts.items()):
        lines.append(f'fleethq_queue_depth{{project="{_label(project_id)}"}} {by_state["todo"]}')
    lines += ["# HELP fleethq_oldest_queued_seconds How long the oldest queued job has waited "
              "since it was enqueued (0: nothing queued)",
              "# TYPE fleethq_oldest_queued_seconds gauge"]
    for project_id, age in sorted(counters.oldest_queued_s(project_ids).items()):
        lines.append(f'fleethq_oldest_queued_seconds{{project="{_label(project_id)}"}} {round(age or 0.0, 3)}')
    lines += _hook_metrics(project_ids)
    lines += _spool_metrics()
    lines += _site_metrics()
    return "\n".join(lines) + "\n"


def _site_metrics() -> list[str]:
    """Paused sites and each site limit's attempts in flight (app.sites)."""
    found = sites.overview()
    lines = ["# HELP fleethq_site_paused_seconds Seconds until a paused site's jobs may start again",
             "# TYPE fleethq_site_paused_seconds gauge"]
    now = time.time()
    lines += [f'fleethq_site_paused_seconds{{site="{_label(p["site"])}"}} {max(0.0, p["until"] - now):.0f}'
              for p in found["pauses"]]
    labelled = [(f'site="{_label(r["site"])}",project="{_label(r["project_id"] or "")}"', r)
                for r in found["limits"]]
    lines += ["# HELP fleethq_site_in_flight Attempts in flight of a limited site (per rule)",
              "# TYPE fleethq_site_in_flight gauge"]
    lines += [f"fleethq_site_in_flight{{{labels}}} {rule['in_flight']}" for labels, rule in labelled]
    lines += ["# HELP fleethq_site_max_in_flight A site rule's limit of attempts in flight",
              "# TYPE fleethq_site_max_in_flight gauge"]
    lines += [f"fleethq_site_max_in_flight{{{labels}}} {rule['max_in_flight']}"
              for labels, rule in labelled if rule["max_in_flight"] is not None]
    return lines


def _spool_metrics() -> list[str]:
    # Both sides of the quota: alert on reserved / max before workers get 507.
    return ["# HELP fleethq_spool_reserved_bytes Master spool quota held by uploads not yet archived",
            "# TYPE fleethq_spool_reserved_bytes gauge",
            f"fleethq_spool_reserved_bytes {spool.reserved_bytes()}",
            "# HELP fleethq_spool_max_bytes Master spool quota (SPOOL_MAX_BYTES); uploads past it get 507",
            "# TYPE fleethq_spool_max_bytes gauge",
            f"fleethq_spool_max_bytes {int(current_app.config['SPOOL_MAX_BYTES'])}"]


# delivery state → (metric, help); skipped deliveries are not failures.
_HOOK_METRICS = {
    "failed": ("fleethq_hook_deliveries_failed", "Hook deliveries that ran out of tries"),
    "skipped": ("fleethq_hook_deliveries_skipped",
                "Hook deliveries skipped because their consumer is disabled (not failures)"),
}


def _hook_metrics(project_ids: list[str]) -> list[str]:
    counts = deliveries.failed_and_skipped()
    lines = []
    for state, (name, help_text) in _HOOK_METRICS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for project_id in project_ids:
            value = counts.get(project_id, {}).get(state, 0)
            lines.append(f'{name}{{project="{_label(project_id)}"}} {value}')
    return lines


def _process_metrics() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    from prometheus_client import REGISTRY
    return generate_latest(REGISTRY)


def render_retention_metrics() -> str:
    """Rows pruned per kind (from ``retention_stats``, so every process
    reports the same totals) and the estimated size of the pruned tables."""
    pruned = retention_stats.pruned()
    lines = ["# HELP fleethq_pruned_rows_total Rows deleted by retention pruning",
             "# TYPE fleethq_pruned_rows_total counter"]
    lines += [f'fleethq_pruned_rows_total{{kind="{kind}"}} {pruned.get(kind, {}).get("total", 0)}'
              for kind in sorted(set(retention.KINDS) | set(pruned))]
    lines += ["# HELP fleethq_table_rows Rows kept per table (PostgreSQL's estimate, not a count)",
              "# TYPE fleethq_table_rows gauge"]
    lines += [f'fleethq_table_rows{{table="{table}"}} {rows}'
              for table, rows in retention_stats.table_rows().items()]
    return "\n".join(lines) + "\n"


def _may_read_metrics() -> bool:
    token = current_app.config.get("METRICS_TOKEN")
    if token and hmac.compare_digest(request.headers.get("Authorization", "").encode("latin-1", "replace"),
                                     f"Bearer {token}".encode("latin-1", "replace")):
        return True
    try:
        address = ipaddress.ip_address(request.remote_addr or "")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in metrics_networks(current_app.config))


def observe_request(method: str, endpoint: str, status: int, started: float) -> None:
    """Count a request served since ``started`` (``time.perf_counter()``)."""
    REQUEST_LATENCY.labels(method, endpoint, str(status)).observe(time.perf_counter() - started)


def init_app(app) -> None:
    @app.before_request
    def _start_timer():
        g.metrics_started = time.perf_counter()

    @app.after_request
    def _observe(response):
        started = getattr(g, "metrics_started", None)
        if started is not None:
            endpoint = request.url_rule.rule if request.url_rule is not None else "unmatched"
            observe_request(request.method, endpoint, response.status_code, started)
        return response

    @app.get("/metrics")
    def metrics():
        if not _may_read_metrics():
            return Response("403: /metrics answers the networks of FLEETHQ_METRICS_ALLOW and "
                            "scrapers sending Authorization: Bearer FLEETHQ_METRICS_TOKEN\n",
                            status=403, mimetype="text/plain")
        body = (render_queue_metrics() + render_retention_metrics()).encode() + _process_metrics()
        return Response(body, mimetype=CONTENT_TYPE_LATEST)
