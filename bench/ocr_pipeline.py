"""Scanned pages through the whole OCR pipeline, against OCRmyPDF by hand.

Makes ``--papers`` scanned papers of ``--pages`` pages each (rendered words
as images, no text layer; three distinct words per page) and, in the same
run:

- direct: ``python -m ocrmypdf`` with the worker's own options
  (:func:`workers.ocr.ocrmypdf_argv`) on each file in turn — what an
  operator running OCRmyPDF by hand pays; run before and after the
  pipeline, the mean of the two counts;
- pipeline: a master as in production (gunicorn, one Dramatiq task
  process, the clock) with a source project whose derive consumer feeds an
  OCR project, and one ``fleethq-worker run --task ocr`` at concurrency 1.
  The papers are uploaded into the source project over the API; the clock
  runs from the first upload until every derived job is done and its text
  is searchable: archive → hook → derived job → source download → OCR →
  text and PDF upload → archive → index.

Both run one page at a time (``FLEETHQ_OCR_JOBS=1``) at normal priority.
Then every word is searched through ``GET /api/v1/admin/search`` and must
find its own paper.

Last line: ``ocr_pipeline pages_per_min=… direct_pages_per_min=… ratio=…
words_found=F/W`` (goal: ratio ≥ 0.8, every word found).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import redis
import requests

from _common import (ROOT, VERSION, Master, admin_token, api, flask_cli, fresh_database,
                     stop)

REDIS_URL = os.environ.get("FLEETHQ_BENCH_REDIS", "redis://127.0.0.1:6379/14")
# Everyday English words Tesseract reads reliably, three to a page.
WORDS = ("harbour lantern meadow violin falcon granite orchid sailor copper whisper "
         "thunder marble candle forest silver river garden window basket ladder pepper "
         "rocket kitten tunnel bridge castle dragon feather island jacket kettle lemon "
         "mirror needle orange pillow rabbit saddle temple valley wallet yellow zebra "
         "anchor butter carpet dinner engine finger guitar hammer insect jungle "
         "blanket cabbage dentist elbow fountain giraffe helmet iceberg jigsaw kingdom "
         "lobster mustard napkin octopus parrot quarry raisin scissors teapot umbrella "
         "vinegar walnut printer lizard monkey cherry planet harvest pencil statue "
         "trumpet velvet wizard cottage meteor sandal puzzle bottle circus pirate").split()


def make_papers(directory: str, papers: int, pages: int) -> list[tuple[str, list[str]]]:
    from tests.scans import scanned_pdf
    if papers * pages * 3 > len(WORDS):
        raise SystemExit(f"at most {len(WORDS) // 3} pages: the word list is that long")
    made, words = [], iter(WORDS)
    for n in range(papers):
        lines = [[" ".join(next(words) for _ in range(3))] for _ in range(pages)]
        path = os.path.join(directory, f"scan-{n}.pdf")
        scanned_pdf(Path(path), lines)
        made.append((path, [w for page in lines for w in page[0].split()]))
    return made


def direct(papers, scratch: str, languages: str) -> float:
    """Seconds OCRmyPDF alone takes for every paper, one after the other."""
    from workers.ocr import OcrLimits, ocrmypdf_argv
    limits = OcrLimits(jobs=1, nice=0)
    env = {**os.environ, "TMPDIR": scratch}

    def one(path: str, out: str) -> None:
        # The engine's own command line, text sidecar included: by hand too
        # one wants the words, not only the PDF.
        argv = ocrmypdf_argv(Path(path), Path(out), tuple(languages.split("+")), limits,
                             sidecar=Path(out + ".txt"))
        subprocess.run(argv, check=True, env=env, capture_output=True)
    one(papers[0][0], os.path.join(scratch, "warm.pdf"))  # caches warm, not counted
    began = time.perf_counter()
    for n, (path, _) in enumerate(papers):
        one(path, os.path.join(scratch, f"direct-{n}.pdf"))
    return time.perf_counter() - began


class Pipeline:
    def __init__(self, tmp: str):
        self.tmp = tmp
        self.db_url = fresh_database("fleethq_bench_ocr")
        self.token = admin_token(self.db_url)
        redis.Redis.from_url(REDIS_URL).flushdb()
        self.master = Master(self.db_url, os.path.join(tmp, "master"), REDIS_URL, clock=True)
        self.admin = api(self.master.base, self.token)
        self.worker = None

    def close(self) -> None:
        if self.worker is not None:
            stop(self.worker)
        self.master.stop()

    def url(self, path: str) -> str:
        return self.master.base + path

    def setup(self, languages: str) -> None:
        for name in ("papers", "papers-ocr"):
            self.admin.put(self.url(f"/api/v1/fleethq/projects/{name}"), json={
                "kind": "pdf", "identity_mode": "unique_value", "client_versions": [VERSION],
                "max_in_flight": 64, "max_worker_in_flight": 64}).raise_for_status()
        self.admin.post(self.url("/api/v1/admin/projects/papers/hooks"), json={
            "name": "ocr", "kind": "derive", "target_project": "papers-ocr",
            "profile": {"name": "ocr", "languages": languages}}).raise_for_status()
        volume = os.path.join(self.tmp, "ocr-volume")
        env = {**os.environ, "DATABASE_URL": self.db_url, "FLEETHQ_OCR_JOBS": "1",
               "FLEETHQ_OCR_NICE": "0", "FLEETHQ_MIN_FREE_BYTES": "0",
               "FLEETHQ_ENROLL": flask_cli(self.db_url, "enroll").splitlines()[-1]}
        cmd = [sys.executable, "-m", "workers.runner.cli", "run", "--master", self.master.base,
               "--volume", volume, "--project", "papers-ocr", "--task", "ocr", "--concurrency", "1",
               "--ocr-languages", languages, "--allow-http", "--client-version", VERSION,
               "--heartbeat-seconds", "2"]
        log = open(os.path.join(self.tmp, "ocr-worker.log"), "ab")
        self.worker = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=log, stdout=log)
        identity = os.path.join(volume, "identity.json")
        deadline = time.monotonic() + 60
        while not (os.path.exists(identity) and json.load(open(identity)).get("registered")):
            if time.monotonic() > deadline or self.worker.poll() is not None:
                raise SystemExit("the OCR worker did not register; see ocr-worker.log")
            time.sleep(0.2)
        worker_id = json.load(open(identity))["worker_id"]
        flask_cli(self.db_url, "worker", "approve", worker_id)
        # The clock starts with the worker waiting on an empty queue, as an
        # OCR host of a running fleet does: not while its approval is still
        # on the way to it (up to one heartbeat).
        deadline = time.monotonic() + 60
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not conn.execute("SELECT last_heartbeat_at > decided_at FROM fleet_nodes "
                                   "WHERE id = %s", (worker_id,)).fetchone()[0]:
                if time.monotonic() > deadline or self.worker.poll() is not None:
                    raise SystemExit("the OCR worker did not see its approval; see ocr-worker.log")
                time.sleep(0.1)
        time.sleep(0.5)  # its claim loop resumes at once; a moment for the first long poll

    def run(self, papers) -> float:
        """Seconds from the first source upload until every derived job is done."""
        values = [{"value": f"10.5555/ocr-bench-{n}"} for n in range(len(papers))]
        self.admin.post(self.url("/api/v1/admin/projects/papers/jobs"), json={"jobs": values}).raise_for_status()
        self.admin.post(self.url("/api/v1/fleet/heartbeat"), json={
            "worker_id": "uploader", "capacity": 64, "browser_ok": False, "disk_free_bytes": 1 << 40,
            "spool_bytes": 0, "running_attempt_ids": []}).raise_for_status()
        claimed = self.admin.post(self.url("/api/v1/projects/papers/jobs/claim"), json={
            "worker_id": "uploader", "max_jobs": len(papers), "lease_seconds": 3600}).json()["jobs"]
        by_value = {job["value"]: job for job in claimed}
        began = time.perf_counter()
        for n, (path, _) in enumerate(papers):
            data = open(path, "rb").read()
            job = by_value[values[n]["value"]]
            self.admin.put(self.url(f"/api/v1/fleet/uploads/{job['attempt_id']}"), data=data, headers={
                "Content-Type": "application/pdf", "X-PDF-SHA256": hashlib.sha256(data).hexdigest(),
                "X-PDF-Size": str(len(data))}, timeout=120).raise_for_status()
        deadline = time.monotonic() + 60 + 120 * len(papers)
        while True:
            counts = self.admin.get(self.url("/api/v1/fleethq/projects/papers-ocr")).json()["job_counts"]
            if counts.get("done", 0) + counts.get("failed", 0) + counts.get("reset_exhausted", 0) >= len(papers):
                return time.perf_counter() - began
            if time.monotonic() > deadline or self.worker.poll() is not None:
                raise SystemExit(f"pipeline did not finish: {counts}; see ocr-worker.log")
            time.sleep(0.05)

    def found(self, papers) -> tuple[int, int]:
        found = total = 0
        for n, (_, words) in enumerate(papers):
            for word in words:
                total += 1
                answer = self.admin.get(self.url("/api/v1/admin/search"), params={"q": word}).json()
                keys = {hit["canonical_key"] for hit in answer.get("results", [])}
                found += f"doi:10.5555/ocr-bench-{n}" in keys
        return found, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--papers", type=int, default=10)
    parser.add_argument("--pages", type=int, default=3)
    parser.add_argument("--languages", default="eng")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="fleethq-bench-ocr-")
    pages = args.papers * args.pages
    try:
        papers = make_papers(tmp, args.papers, args.pages)
        scratch = os.path.join(tmp, "direct")
        os.makedirs(scratch)
        before_s = direct(papers, scratch, args.languages)
        print(f"direct: {pages} pages in {before_s:.1f} s", flush=True)
        pipeline = Pipeline(tmp)
        try:
            pipeline.setup(args.languages)
            pipeline_s = pipeline.run(papers)
            print(f"pipeline: {pages} pages in {pipeline_s:.1f} s", flush=True)
            found, total = pipeline.found(papers)
        finally:
            pipeline.close()
        # The baseline runs on both sides of the pipeline and counts as their
        # mean, so a machine that speeds up or slows down during the run
        # (shared cores, thermal limits) tilts neither side of the ratio.
        after_s = direct(papers, scratch, args.languages)
        print(f"direct again: {pages} pages in {after_s:.1f} s", flush=True)
        direct_s = (before_s + after_s) / 2
    except (requests.RequestException, subprocess.CalledProcessError) as exc:
        print(f"ocr_pipeline error={type(exc).__name__}: {str(exc)[:300]}")
        raise SystemExit(1) from None
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    rate, direct_rate = pages / pipeline_s * 60, pages / direct_s * 60
    print(f"ocr_pipeline pages_per_min={rate:.1f} direct_pages_per_min={direct_rate:.1f} "
          f"ratio={rate / direct_rate:.2f} words_found={found}/{total}")


if __name__ == "__main__":
    main()
