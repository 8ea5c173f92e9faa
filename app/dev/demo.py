"""The demos ``make dev`` fills the master with (:mod:`app.dev`).

A generic project of 300 jobs, then the pdf demo: the local test publisher, a
``demo-papers`` project of 50 papers and the local fetcher (``flask fleet
local-worker``, volume ``./var/fetcher``) that fetches and archives them while
a progress bar runs.
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from app.dev.procs import Stack, StepFailed, print_lock, say
from workers.runner.settings import default_client_version

DEMO_PROJECT = "demo"
DEMO_JOBS = 300
PDF_PROJECT = "demo-papers"
# The version this checkout's worker sends by default, so that a worker
# started by hand (the enrollment page's command) is accepted as printed.
WORKER_VERSION = default_client_version()


def api(base: str, token: str, method: str, path: str, body=None, headers=None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}{path}", data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise StepFailed(f"{method} {path} answered {exc.code}: "
                         f"{exc.read()[:500].decode(errors='replace')}") from exc


def demo(base: str, token: str) -> None:
    api(base, token, "PUT", f"/api/v1/fleethq/projects/{DEMO_PROJECT}",
        {"kind": "generic", "identity_mode": "external_id"})
    jobs = [{"id": f"demo-{i:04d}", "value": f"https://example.org/items/{i}"} for i in range(DEMO_JOBS)]
    # Same ids and values on every run: re-enqueueing is idempotent (DESIGN §4.3).
    result = api(base, token, "POST", f"/api/v1/admin/projects/{DEMO_PROJECT}/jobs", {"jobs": jobs})
    summary = api(base, token, "GET", f"/api/v1/admin/projects/{DEMO_PROJECT}")
    say("demo", f"project {DEMO_PROJECT!r}: submitted {result.get('submitted')}, "
                f"inserted {result.get('inserted')}; job_counts {summary.get('job_counts')}")


# --- the pdf demo: local publisher → local fleethq-worker → archive ----------------

def demo_papers() -> list[str]:
    """50 papers as DOIs, resolved by the publisher's /doi/ route: the values do
    not depend on the publisher's port, so a second `make dev` re-enqueues the
    same jobs (a no-op) instead of adding 50 more. Most are fetched over HTTP,
    three only by the browser, three fail (not found, paywall, HTML as PDF)."""
    http = ["papers/{n}.pdf", "landing/{n}", "links/{n}", "attachment/{n}", "chain/3/{n}"]
    routes = [http[n % len(http)].format(n=n) for n in range(1, 45)]
    routes += ["jslink/45", "jsredirect/46", "jslink/47", "missing/48", "paywall403/49", "fakepdf/50"]
    return ["10.5555/" + route for route in routes]


def start_publisher(stack: Stack):
    # The test suite's publisher doubles as the demo's internet (repo checkout only).
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.publisher import Publisher
    publisher = Publisher(paper_bytes=1024 * 1024).start()
    stack.stoppers.append(("publisher", publisher.stop))
    say("demo", f"local publisher at {publisher.url} (DOI resolver {publisher.url}/doi/)")
    return publisher


def start_fetcher(stack: Stack, base: str, env: dict, publisher) -> None:
    """The local fetcher (``flask fleet local-worker``, volume ``./var/fetcher``):
    its node is created and approved on the first run and found again on the
    next; it fetches from the local publisher only."""
    py = sys.executable
    fetcher_env = {**env, "FLEETHQ_LOG_LEVEL": os.environ.get("FLEETHQ_LOG_LEVEL", "WARNING")}
    stack.spawn("fetcher", [
        py, "-m", "flask", "--app", "wsgi", "fleet", "local-worker",
        "--volume", str(stack.var / "fetcher"), "--master-url", base, "--concurrency", "4",
        "--name", "devstack-fetcher", "--",
        "--project", PDF_PROJECT, "--client-version", WORKER_VERSION,
        "--doi-resolver", f"{publisher.url}/doi/",
        "--allow-networks", f"{publisher.host}/32"],   # the publisher, nothing else local
        fetcher_env)


def pdf_demo(stack: Stack, base: str, token: str, env: dict, publisher) -> None:
    api(base, token, "PUT", f"/api/v1/fleethq/projects/{PDF_PROJECT}", {
        "kind": "pdf", "identity_mode": "unique_value", "client_versions": [WORKER_VERSION],
        "max_in_flight": 16, "max_worker_in_flight": 8, "retry_backoff_seconds": 2, "max_resets": 1})
    values = demo_papers()
    result = api(base, token, "POST", f"/api/v1/admin/projects/{PDF_PROJECT}/jobs",
                 {"jobs": [{"value": v} for v in values]})
    say("demo", f"project {PDF_PROJECT!r}: {result.get('submitted')} papers submitted, "
                f"{result.get('inserted')} new")
    start_fetcher(stack, base, env, publisher)
    counts = watch_progress(stack, base, token)
    say("demo", summary(base, token, env["DATABASE_URL"], counts))


def watch_progress(stack: Stack, base: str, token: str) -> dict:
    """A progress bar until nothing is waiting, in flight or staged."""
    tty, last, shown = sys.stdout.isatty(), None, 0.0
    while True:
        stack.check_children()
        counts = api(base, token, "GET", f"/api/v1/fleethq/projects/{PDF_PROJECT}")["job_counts"]
        total = sum(counts.values())
        failed = counts["failed"] + counts["reset_exhausted"]
        settled = counts["done"] + failed
        width = 30
        bar = "#" * (width * settled // max(total, 1))
        line = (f"{PDF_PROJECT} [{bar:.<{width}}] {settled}/{total} settled: {counts['done']} archived,"
                f" {failed} failed, {counts['wip']} fetching, {counts['staged']} staged")
        if tty:
            with print_lock:
                sys.stdout.write("\r" + line)
                sys.stdout.flush()
        elif line != last and (time.monotonic() - shown > 2 or settled == total):
            say("demo", line)
            shown = time.monotonic()
        last = line
        if settled == total:
            if tty:
                with print_lock:
                    sys.stdout.write("\n")
            return counts
        time.sleep(0.5)


def summary(base: str, token: str, database_url: str, counts: dict) -> str:
    import psycopg
    from app.config import libpq_url, sqlalchemy_url
    by_code: dict[str, int] = {}
    for status in ("failed", "reset_exhausted"):
        page = api(base, token, "GET",
                   f"/api/v1/fleethq/projects/{PDF_PROJECT}/jobs?status={status}&limit=200")
        for job in page["jobs"]:
            code = (job.get("last_error") or {}).get("code", "unknown")
            by_code[code] = by_code.get(code, 0) + 1
    with psycopg.connect(libpq_url(sqlalchemy_url(database_url))) as conn:
        size = conn.execute("SELECT coalesce(sum(size), 0)::bigint FROM uploads "
                            "WHERE project_id = %s AND state = 'done'", (PDF_PROJECT,)).fetchone()[0]
    failed = ", ".join(f"{code} {n}" for code, n in sorted(by_code.items())) or "none"
    return (f"{PDF_PROJECT}: {counts['done']} archived ({size / 1024 / 1024:.1f} MiB), "
            f"failed by code: {failed}; see {base}/admin/projects/{PDF_PROJECT}")

