"""Import a 1,000,000-job packed source through the API (streamed to
gunicorn); baseline: PostgreSQL ``COPY`` of the same rows into the same table.

Last line: ``enqueue_throughput jobs_per_s=N copy_jobs_per_s=M ratio=R peak_rss_mb=X``
(peak RSS of the web worker process during the import).
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
import time

import psycopg
import requests

from _common import admin_token, fresh_database, gunicorn, tree_rss_mb

from workers.wire.protocol import default_job_id
from workers.wire.source import write_source


def specs(n: int):
    for i in range(n):
        value = f"https://example.org/paper/{i:09d}?ref=bench"
        yield {"id": default_job_id(value), "value": value, "type": "seed"}


class RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self._halt = pid, 0.0, threading.Event()

    def run(self):
        while not self._halt.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.pid))
            time.sleep(0.05)

    def stop(self):
        self._halt.set()
        self.join()


def copy_baseline(url: str, project: str, n: int) -> float:
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO projects (id, kind, status, identity_mode, claim_order, "
                     "max_jobs_per_claim, max_resets, recommended_lease_seconds, retry_backoff_seconds, "
                     "client_versions, prefer_new_worker, upload_timeout_seconds) VALUES "
                     "(%s, 'generic', 'active', 'external_id', 'fifo', 256, 3, 300, 0, '{}', false, 120)",
                     (project,))
        conn.commit()
        # Rows are formatted before the clock starts: the baseline is COPY itself.
        data = "".join(f"{project}\t{spec['id']}\t{spec['value']}\t{spec['type']}\t"
                       f"{random.randint(-2**31, 2**31 - 1)}\n" for spec in specs(n)).encode()
        started = time.perf_counter()
        with conn.cursor().copy("COPY jobs (project_id, ext_id, value, type, random_key) FROM STDIN") as copy:
            for offset in range(0, len(data), 1 << 20):
                copy.write(data[offset:offset + (1 << 20)])
        conn.commit()
        return n / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()

    url = fresh_database("fleethq_bench_enqueue")
    token = admin_token(url)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "jobs.jsonl.zst")
        with open(path, "wb") as out:
            write_source(specs(args.jobs), out, level=3)
        size_mb = os.path.getsize(path) / 2**20
        print(f"source: {args.jobs} jobs, {size_mb:.1f} MiB compressed", flush=True)

        with gunicorn(url, workers=1, threads=2) as (base, proc):
            session = requests.Session()
            session.headers["Authorization"] = f"Bearer {token}"
            session.put(f"{base}/api/v1/fleethq/projects/imported",
                        json={"identity_mode": "external_id"}).raise_for_status()
            sampler = RssSampler(proc.pid)
            sampler.start()
            started = time.perf_counter()
            with open(path, "rb") as body:
                response = session.post(f"{base}/api/v1/admin/projects/imported/source", data=body,
                                        headers={"Content-Type": "application/zstd"}, timeout=3600)
            elapsed = time.perf_counter() - started
            sampler.stop()
            response.raise_for_status()
            result = response.json()
            assert result["inserted"] == args.jobs, result
        api_rate = args.jobs / elapsed
        print(f"api import: {args.jobs} jobs in {elapsed:.2f}s = {api_rate:.0f} jobs/s, "
              f"web peak rss {sampler.peak:.0f} MB (gunicorn arbiter + worker)", flush=True)
    copy_rate = copy_baseline(url, "copied", args.jobs)
    print(f"copy baseline: {copy_rate:.0f} jobs/s", flush=True)
    print(f"enqueue_throughput jobs_per_s={api_rate:.0f} copy_jobs_per_s={copy_rate:.0f} "
          f"ratio={api_rate / copy_rate:.2f} peak_rss_mb={sampler.peak:.0f}")


if __name__ == "__main__":
    main()
