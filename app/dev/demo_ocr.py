"""The OCR demo of ``make dev`` (:mod:`app.dev`), after the pdf demo.

Scanned papers (rendered words as images, no text layer) go into
``demo-scans`` the way a worker uploads a download; its derive consumer
enqueues one job per archived paper into ``demo-scans-ocr``. Two lanes
serve that project:

- ``ocr-remote``: an enrolled ``fleethq-worker run --task ocr``, first
  choice by the project's ``lane_order`` ``remote_first`` — the on-demand
  OCR host of a split-host setup (here on this machine, volume
  ``./var/ocr-remote``);
- the local fetcher's OCR twin (``flask fleet local-worker -- --task ocr``,
  concurrency 1, OCR children niced; tier ``auto``, so fallback there): it
  takes a job only when the remote lane is away or the job waited
  ``fallback_after_seconds``.

The demo ends when every scan is searchable, and prints a search for one
word of each.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from app.dev.demo import WORKER_VERSION, api
from app.dev.procs import Stack, StepFailed, say

SOURCE, TARGET = "demo-scans", "demo-scans-ocr"
DOCUMENTS = "documents"  # app/dev/demo_documents.py: the consume folder's project
AS_WORKER = {"X-Client-Version": WORKER_VERSION}
SCANS = [["harbour lantern", "meadow violin"], ["falcon granite"], ["orchid sailor", "copper whisper"],
         ["thunder marble"], ["candle forest", "silver river"], ["garden window"]]


def _scan_bytes(var: Path, n: int, lines: list[str]) -> bytes:
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.scans import scanned_pdf  # the test suite's scanner doubles as the demo's
    path = var / "scans" / f"scan-{n}.pdf"
    path.parent.mkdir(parents=True, exist_ok=True)
    # A few more lines a page, as on a real scan (and over the master's upload minimum).
    filler = ["scanned for the FleetHQ demo", "every word of this page", "is found by its text"]
    return scanned_pdf(path, [[line, *filler] for line in lines]).read_bytes()


def _raw(base: str, token: str, method: str, path: str, data: bytes, headers: dict) -> None:
    import urllib.error
    import urllib.request
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120):
            pass
    except urllib.error.HTTPError as exc:
        raise StepFailed(f"{method} {path} answered {exc.code}: "
                         f"{exc.read()[:500].decode(errors='replace')}") from exc


def _enqueue_scans(base: str, token: str) -> None:
    values = [{"value": f"10.5555/scan/{n}"} for n in range(len(SCANS))]
    api(base, token, "POST", f"/api/v1/admin/projects/{SOURCE}/jobs", {"jobs": values})


def _upload_scans(stack: Stack, base: str, token: str) -> int:
    """Archive the waiting scans in demo-scans as a (token) worker would;
    returns how many it sent. A scan claimed by an earlier, interrupted run
    comes back when its short lease runs out, and is sent then."""
    api(base, token, "POST", "/api/v1/fleet/heartbeat", {  # claims need a fresh one
        "worker_id": "demo-scanner", "capacity": 8, "browser_ok": None,
        "disk_free_bytes": 1 << 40, "spool_bytes": 0, "running_attempt_ids": []}, AS_WORKER)
    claimed = api(base, token, "POST", f"/api/v1/projects/{SOURCE}/jobs/claim", {
        "worker_id": "demo-scanner", "max_jobs": len(SCANS), "lease_seconds": 30}, AS_WORKER)["jobs"]
    for job in claimed:
        n = int(job["value"].rsplit("/", 1)[1])
        data = _scan_bytes(stack.var, n, SCANS[n])
        _raw(base, token, "PUT", f"/api/v1/fleet/uploads/{job['attempt_id']}", data, {
            **AS_WORKER, "Content-Type": "application/pdf",
            "X-PDF-SHA256": hashlib.sha256(data).hexdigest(), "X-PDF-Size": str(len(data))})
    # Done, as a worker that stops cleanly says so: no slot on offer (the
    # workers page then shows it signed off, not stale).
    api(base, token, "POST", "/api/v1/fleet/heartbeat", {
        "worker_id": "demo-scanner", "capacity": 0, "browser_ok": None,
        "disk_free_bytes": 1 << 40, "spool_bytes": 0, "running_attempt_ids": []}, AS_WORKER)
    return len(claimed)


def _start_remote(stack: Stack, base: str, token: str, env: dict) -> None:
    """An enrolled OCR node (first choice), approved once; its volume keeps the identity."""
    volume = stack.var / "ocr-remote"
    identity = volume / "identity.json"
    py = sys.executable
    worker_env = dict(env)
    if not identity.exists():
        made = subprocess.run([py, "-m", "flask", "--app", "wsgi", "fleet", "enroll"], env=env,
                              capture_output=True, text=True)
        if made.returncode != 0:
            raise StepFailed(f"flask fleet enroll failed: {made.stderr[-500:]}")
        worker_env["FLEETHQ_ENROLL"] = made.stdout.strip().splitlines()[-1]
    stack.spawn("ocr-remote", [
        py, "-m", "workers.runner.cli", "run", "--master", base, "--volume", str(volume),
        "--project", TARGET, "--project", DOCUMENTS, "--task", "ocr", "--concurrency", "1", "--allow-http",
        "--client-version", WORKER_VERSION, "--name", "ocr-remote"], worker_env)
    deadline = time.monotonic() + 60
    while not (identity.exists() and json.loads(identity.read_text()).get("registered")):
        stack.check_children()
        if time.monotonic() > deadline:
            raise StepFailed("the OCR node did not register")
        time.sleep(0.2)
    worker_id = json.loads(identity.read_text())["worker_id"]
    workers = api(base, token, "GET", "/api/v1/admin/fleet/workers")["workers"]
    if any(w["worker_id"] == worker_id and w["status"] == "active" for w in workers):
        return  # approved on an earlier run
    stack.run_step("ocr-approve", [py, "-m", "flask", "--app", "wsgi", "fleet", "worker", "approve",
                                   worker_id], env)


def _start_local(stack: Stack, base: str, env: dict) -> None:
    stack.spawn("ocr-local", [
        sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "local-worker",
        "--volume", str(stack.var / "ocr-local"), "--master-url", base, "--concurrency", "1",
        "--name", "devstack-ocr-local", "--",
        "--project", TARGET, "--project", DOCUMENTS, "--task", "ocr", "--client-version", WORKER_VERSION], env)


def ocr_demo(stack: Stack, base: str, token: str, env: dict) -> None:
    for name in (SOURCE, TARGET):
        # OCR is heavy: its project offers jobs to the remote host first
        # (the scans themselves, pdf's default, the local lane first).
        api(base, token, "PUT", f"/api/v1/fleethq/projects/{name}", {
            "kind": "pdf", "identity_mode": "unique_value", "client_versions": [WORKER_VERSION],
            "max_in_flight": 8, "max_worker_in_flight": 4, "retry_backoff_seconds": 2,
            "lane_order": "remote_first" if name == TARGET else "local_first"})
    consumers = api(base, token, "GET", f"/api/v1/admin/projects/{SOURCE}/hooks")["consumers"]
    if not any(c["kind"] == "derive" for c in consumers):
        api(base, token, "POST", f"/api/v1/admin/projects/{SOURCE}/hooks", {
            "name": "ocr", "kind": "derive", "target_project": TARGET,
            "profile": {"name": "ocr", "languages": "eng"}})
    worker_env = {**env, "FLEETHQ_LOG_LEVEL": env.get("FLEETHQ_LOG_LEVEL", "WARNING")}
    _start_remote(stack, base, token, worker_env)
    _start_local(stack, base, worker_env)
    _enqueue_scans(base, token)
    say("ocr", f"{len(SCANS)} scanned papers go into {SOURCE!r}; OCR lanes: ocr-remote (first), "
               "devstack-ocr-local (fallback, niced)")
    deadline = time.monotonic() + 600
    while True:
        stack.check_children()
        _upload_scans(stack, base, token)
        sources = api(base, token, "GET", f"/api/v1/fleethq/projects/{SOURCE}")["job_counts"]
        counts = api(base, token, "GET", f"/api/v1/fleethq/projects/{TARGET}")["job_counts"]
        settled = counts["done"] + counts["failed"] + counts["reset_exhausted"]
        if sources["done"] >= len(SCANS) and settled >= len(SCANS):
            break
        if time.monotonic() > deadline:
            raise StepFailed(f"OCR did not finish: {SOURCE} {sources}, {TARGET} {counts}")
        time.sleep(1)
    for lines in SCANS:
        word = lines[0].split()[0]
        hits = api(base, token, "GET", "/api/v1/admin/search?" + urllib.parse.urlencode({"q": word}))
        keys = [hit["canonical_key"] for hit in hits.get("results", [])]
        say("ocr", f"search {word!r}: {', '.join(keys) or 'nothing found'}")
    say("ocr", f"{TARGET}: {counts['done']} OCRed; search them at {base}/admin/search")
