"""Politeness at fleet scale: per-site limits and a pushed-back site across
a fleet of worker slots, against a publisher that measures what it receives.

A fresh master (gunicorn, as deployed) holds ``--jobs`` generic jobs over
``--sites`` sites (named in ``attr.fleethq_site``), queued site after site
as a batch of one publisher's DOIs would be: without limits the whole fleet
lands on one site at a time.
``--slots`` worker threads each claim one job at a time over HTTP, fetch its
URL from the measuring publisher (``--fetch-ms`` per request) and complete it.
Two runs, one after the other, same work:

- *limited*: every site has a rule for the project (at most 1..3 attempts in
  flight); one site answers its first request with 429 and ``Retry-After:
  3600``, which the slot reports as ``throttled`` — the master pauses it for
  the whole fleet;
- *unlimited*: another project with sites of other names, no rule, no
  pushback: the baseline.

The publisher counts each site's concurrent requests: a request beyond the
site's limit is a violation; a request of a job whose claim was asked after
the pause was committed is a paused-site hit. ``ratio`` is the limited run's claim rate
over the unlimited run's.

Last line: ``politeness jobs=… violations=… max_site_concurrency=…
paused_site_hits=… claims_per_s=… unlimited_claims_per_s=… ratio=… share_error=…``
``share_error``: then every slot serves two projects of share weights 3 and
1 (both queues deeper than the run) and picks its next claim by their shares
as the worker does: the largest deviation of a project's part of the claims
from its weight's part.
"""
from __future__ import annotations

import argparse
import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from _common import VERSION, admin_token, api, fresh_database, gunicorn, json_poster

from workers.runner.shares import Shares

THROTTLED_SITE = "site-00"


class Publisher:
    """Counts concurrent requests per site; the throttled site says 429 once."""

    def __init__(self, limits: dict[str, int], fetch_s: float, throttle: bool):
        self.limits, self.fetch_s, self.throttle = limits, fetch_s, throttle
        self.lock = threading.Lock()
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.violations = 0
        self.throttled_hits: list[float] = []   # claim times of the throttled site's requests
        self.requests = 0
        publisher = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                parts = urlsplit(self.path)
                site = parts.path.strip("/").split("/")[0]
                claimed = float(parse_qs(parts.query).get("claimed", ["0"])[0])
                status = publisher.enter(site, claimed)
                if status == 429:
                    body = b"too many requests"
                    self.send_response(429)
                    self.send_header("Retry-After", "3600")
                else:
                    time.sleep(publisher.fetch_s)
                    body = b"%PDF-1.4 pretend"
                    self.send_response(200)
                publisher.leave(site)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def enter(self, site: str, claimed: float) -> int:
        with self.lock:
            self.requests += 1
            now = self.in_flight.get(site, 0) + 1
            self.in_flight[site] = now
            self.peak[site] = max(self.peak.get(site, 0), now)
            if self.throttle and now > self.limits.get(site, 1 << 30):
                self.violations += 1
            if self.throttle and site == THROTTLED_SITE:
                self.throttled_hits.append(claimed)
                return 429
        return 200

    def leave(self, site: str) -> None:
        with self.lock:
            self.in_flight[site] -= 1

    def close(self) -> None:
        self.server.shutdown()


class Slot(threading.Thread):
    """One worker slot: claim one job, fetch it, report it, again. A slot
    serving several projects picks the next by their shares, as the worker
    does (the same ``Shares``, with the weights its heartbeat's answer names)."""

    def __init__(self, base, token, projects, index, publisher_port, run):
        super().__init__(daemon=True)
        self.base, self.token, self.projects, self.index = base, token, projects, index
        self.publisher_port, self.run_state = publisher_port, run

    def run(self):
        post = json_poster(self.base, self.token)
        pub = http.client.HTTPConnection("127.0.0.1", self.publisher_port, timeout=60)
        worker = f"slot-{self.index}"

        shares = Shares()
        shares.weigh(post("/api/v1/fleet/heartbeat", {
            "capacity": 1, "browser_ok": False, "disk_free_bytes": 0, "spool_bytes": 0,
            "running_attempt_ids": [], "worker_id": worker, "projects": self.projects,
        }).get("shares") or {})
        taken: list[tuple[str, dict]] = []

        def ask(project, n):
            jobs = post(f"/api/v1/projects/{project}/jobs/claim",
                        {"worker_id": worker, "max_jobs": n, "lease_seconds": 300})["jobs"]
            taken.extend((project, job) for job in jobs)
            return len(jobs)

        state = self.run_state
        while not state["stop"].is_set():
            # When the claim was asked: one asked after the pause was committed
            # must not get the paused site's jobs (one asked before may).
            claimed = time.time()
            taken.clear()
            shares.round(self.projects, self.projects, lambda: 1 - len(taken), ask)
            if not taken:
                if time.monotonic() > state["idle_deadline"]:
                    return
                time.sleep(0.05)
                continue
            project, job = taken[0]
            with state["lock"]:
                state["claimed"] += 1
                state["by_project"][project] = state["by_project"].get(project, 0) + 1
                state["idle_deadline"] = time.monotonic() + 3.0
            site = job["attr"]["fleethq_site"]
            pub.request("GET", f"/{site}/{job['job_id']}?claimed={claimed:.6f}")
            answer = pub.getresponse()
            answer.read()
            ids = {"job_id": job["job_id"], "attempt_id": job["attempt_id"]}
            if answer.status == 429:
                post(f"/api/v1/projects/{project}/jobs/fail", {"worker_id": worker, "items": [{
                    **ids, "retryable": True, "error": {
                        "code": "throttled", "message": f"{site} is rate limiting us (HTTP 429)",
                        "details": {"http_status": 429, "retry_after_s": 3600}}}]})
                with state["lock"]:
                    state["paused_at"] = state["paused_at"] or time.time()   # committed by now
                continue
            post(f"/api/v1/projects/{project}/jobs/complete", {"worker_id": worker, "items": [{
                **ids, "outcome": {"kind": "success"}}]})
            with state["lock"]:
                state["done"] += 1
                if state["done"] >= state["target"]:
                    state["stop"].set()


def fill(session, base, project, jobs, sites, prefix, weight=1):
    session.put(f"{base}/api/v1/fleethq/projects/{project}", json={
        "kind": "generic", "identity_mode": "none", "client_versions": [VERSION],
        "max_jobs_per_claim": 64, "share_weight": weight}).raise_for_status()
    per_site = jobs // sites
    specs = [{"value": f"https://pub.example/{i}", "attr": {"fleethq_site": f"{prefix}-{i // per_site:02d}"}}
             for i in range(per_site * sites)]
    for start in range(0, jobs, 5000):
        session.post(f"{base}/api/v1/admin/projects/{project}/jobs",
                     json={"jobs": specs[start:start + 5000]}).raise_for_status()


def run(base, token, projects, slots, publisher, target):
    state = {"lock": threading.Lock(), "stop": threading.Event(), "claimed": 0, "done": 0,
             "by_project": {}, "target": target, "paused_at": None,
             "idle_deadline": time.monotonic() + 10.0}
    pool = [Slot(base, token, projects, i, publisher.port, state) for i in range(slots)]
    started = time.perf_counter()
    for slot in pool:
        slot.start()
    for slot in pool:
        slot.join()
    return state, time.perf_counter() - started


def shares(session, base, token, args) -> float:
    """Every slot serves two projects of weights 3 and 1, both deeper than
    the run: the largest deviation of a project's part of the claims from
    its weight's part."""
    weights = {"heavy": 3, "light": 1}
    depth = max(args.jobs // 4, 400)
    for project, weight in weights.items():
        fill(session, base, project, depth, 10, project, weight)
    publisher = Publisher({}, args.fetch_ms / 1000, False)
    # Light first: on a tie the lighter project would be asked first.
    state, elapsed = run(base, token, ["light", "heavy"], args.slots, publisher, depth)
    publisher.close()
    total = sum(weights.values())
    parts = {p: state["by_project"].get(p, 0) / state["claimed"] for p in weights}
    print(f"shares: {state['by_project']} in {elapsed:.1f} s; weights {weights}", flush=True)
    return max(abs(parts[p] - weights[p] / total) for p in weights)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--sites", type=int, default=50)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--fetch-ms", type=float, default=20.0)
    args = parser.parse_args()
    limits = {f"site-{k:02d}": 1 + k % 3 for k in range(args.sites)}
    per_site = args.jobs // args.sites
    url = fresh_database("fleethq_bench_politeness")
    token = admin_token(url)
    with gunicorn(url, workers=2, threads=8) as (base, _):
        session = api(base, token)
        fill(session, base, "limited", args.jobs, args.sites, "site")
        fill(session, base, "unlimited", args.jobs, args.sites, "free")
        for site, n in limits.items():
            session.put(f"{base}/api/v1/fleethq/projects/limited/sites/{site}/limit",
                        json={"max_in_flight": n}).raise_for_status()
        results = {}
        for project in ("limited", "unlimited"):
            throttle = project == "limited"
            publisher = Publisher(limits, args.fetch_ms / 1000, throttle)
            # The throttled site's other jobs wait out its pause: not counted.
            target = per_site * args.sites - (per_site if throttle else 0)
            state, elapsed = run(base, token, [project], args.slots, publisher, target)
            publisher.close()
            results[project] = (state, elapsed, publisher)
            print(f"{project}: {state['done']} done, {state['claimed']} claimed in {elapsed:.1f} s "
                  f"= {state['claimed'] / elapsed:.0f} claims/s; {publisher.requests} requests; "
                  f"peak per site {max(publisher.peak.values())}", flush=True)
            assert state["done"] >= target, (project, state["done"], target)
        share_error = shares(session, base, token, args)
    state, elapsed, publisher = results["limited"]
    paused_at = state["paused_at"]
    paused_hits = sum(1 for t in publisher.throttled_hits if paused_at is not None and t > paused_at)
    peak = max(publisher.peak.values())
    free_peak = max(results["unlimited"][2].peak.values())
    limited_rate = state["claimed"] / elapsed
    free_state, free_elapsed, _ = results["unlimited"]
    free_rate = free_state["claimed"] / free_elapsed
    print(f"without limits one site saw up to {free_peak} requests at once")
    print(f"politeness jobs={args.jobs} violations={publisher.violations} max_site_concurrency={peak} "
          f"paused_site_hits={paused_hits} claims_per_s={limited_rate:.0f} "
          f"unlimited_claims_per_s={free_rate:.0f} ratio={limited_rate / free_rate:.2f} share_error={share_error:.3f}")


if __name__ == "__main__":
    main()
