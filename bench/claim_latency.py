"""One long-polling claimer (wait_ms=30000); jobs enqueued one at a time.

Latency is measured from just before the enqueue request is sent to the moment
the waiting claim's response arrives; the baseline in the same run is the
round trip of the enqueue request alone (the floor for any wake-up).
Last line: ``claim_latency p50_ms=… p95_ms=…``
"""
from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time

from _common import VERSION, admin_token, api, fresh_database, gunicorn


def percentile(samples, q):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()

    url = fresh_database("fleethq_bench_latency")
    token = admin_token(url)
    with gunicorn(url, workers=2, threads=8) as (base, _):
        admin = api(base, token)
        admin.put(f"{base}/api/v1/fleethq/projects/lat", json={
            "identity_mode": "none", "client_versions": [VERSION]}).raise_for_status()
        arrivals: queue.Queue = queue.Queue()
        stop = threading.Event()

        def claimer():
            session = api(base, token)
            while not stop.is_set():
                try:
                    jobs = session.post(f"{base}/api/v1/projects/lat/jobs/claim", json={
                        "worker_id": "waiter", "max_jobs": 1, "lease_seconds": 60,
                        "wait_ms": 30_000}).json()["jobs"]
                except Exception:
                    if stop.is_set():
                        return  # the server is shutting down at the end of the run
                    raise
                now = time.perf_counter()
                for job in jobs:
                    arrivals.put((job["value"], now))

        thread = threading.Thread(target=claimer, daemon=True)
        thread.start()
        time.sleep(0.5)  # let the first claim start waiting
        latencies, round_trips = [], []
        for i in range(args.jobs):
            sent = time.perf_counter()
            admin.post(f"{base}/api/v1/admin/projects/lat/jobs",
                       json={"jobs": [{"value": str(i)}]}).raise_for_status()
            round_trips.append((time.perf_counter() - sent) * 1000)
            value, arrived = arrivals.get(timeout=35)
            assert value == str(i), (value, i)
            latencies.append((arrived - sent) * 1000)
            time.sleep(0.01)
        stop.set()
    print(f"enqueue round trip alone: p50 {statistics.median(round_trips):.1f} ms, "
          f"p95 {percentile(round_trips, 0.95):.1f} ms")
    print(f"claim_latency p50_ms={statistics.median(latencies):.1f} "
          f"p95_ms={percentile(latencies, 0.95):.1f}")


if __name__ == "__main__":
    main()
