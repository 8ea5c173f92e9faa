"""Scanned documents through the consume folder with an OCR host that sleeps.

Makes ``--documents`` scanned documents of ``--pages`` pages each (one-bit
TIFF, as a flatbed scanner writes them; one distinct word a page) and, in
the same run:

- direct: ``python -m ocrmypdf`` with the OCR worker's own options on the
  same pages (each document as the lossless PDF the intake makes of it), one
  after the other: what an operator running OCRmyPDF by hand pays; run
  before and after the pipeline, the mean of the two counts;
- the whole path, as in production: gunicorn, one Dramatiq task process, the
  clock, the consume process; a documents project served by two OCR lanes,
  ``remote`` (first choice, concurrency 1: the many-core host of a split
  setup, here on this machine) and ``fallback`` (concurrency 1). The remote
  host is registered and then stopped, and the documents are dropped into
  the consume folder while it is down: the fallback lane grinds alone until
  ``--sleep`` seconds have passed, then the remote host is started on its
  volume. The clock runs from the first drop until every document is done
  and its text searchable: consume → check, convert, archive → OCR run
  queued → source download → OCR → text and PDF upload → archive → index.

Then each page's words are searched through
``/api/v1/fleethq/documents/search`` and must find their own document.

Last line: ``documents n=… done=… failed=0 lost=0 duplicates=0
searchable=… remote_share=… fallback_share=… pages_per_min=…
direct_pages_per_min=… ratio=…`` (goal: ratio ≥ 0.9). Both lanes together
may run two OCRs at once where the direct baseline runs one: on a machine
with more than one free core the ratio can pass 1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psycopg
import redis
import requests

from _common import ROOT, VERSION, Master, admin_token, api, flask_cli, fresh_database, stop
from ocr_pipeline import WORDS  # words Tesseract reads reliably
from ocr_pipeline import direct as ocr_direct

REDIS_URL = os.environ.get("FLEETHQ_BENCH_REDIS", "redis://127.0.0.1:6379/14")
PROJECT = "bench-documents"


def make_documents(directory: str, count: int, pages: int) -> list[tuple[str, list[str]]]:
    from pathlib import Path

    from tests.scans import image_file
    if count * pages > len(WORDS):
        raise SystemExit(f"at most {len(WORDS)} pages: the word list is that long")
    made, words = [], iter(WORDS)
    for n in range(count):
        # One word of the list a page (searched for it), the rest as on any letter.
        lines = [[f"{next(words)} of record {n}", "a scanned page of the benchmark"]
                 for _ in range(pages)]
        path = os.path.join(directory, f"document-{n}.tif")
        image_file(Path(path), lines, "TIFF", mode="1")
        made.append((path, [page[0].split()[0] for page in lines]))
    return made


def direct(documents, scratch: str) -> float:
    """Seconds OCRmyPDF alone takes for every document, one after the other,
    each as the lossless PDF the intake makes of it (the conversion is not
    counted): ocr_pipeline's baseline on these pages."""
    import img2pdf
    pdfs = []
    for n, (path, words) in enumerate(documents):
        pdf = os.path.join(scratch, f"input-{n}.pdf")
        with open(pdf, "wb") as out:
            out.write(img2pdf.convert(path, nodate=True))
        pdfs.append((pdf, words))
    return ocr_direct(pdfs, scratch, "eng")


class Stack:
    def __init__(self, tmp: str):
        self.tmp = tmp
        self.db_url = fresh_database("fleethq_bench_documents")
        self.token = admin_token(self.db_url)
        redis.Redis.from_url(REDIS_URL).flushdb()
        self.folder = os.path.join(tmp, "consume")
        self.master = Master(self.db_url, os.path.join(tmp, "master"), REDIS_URL, clock=True)
        self.admin = api(self.master.base, self.token)
        self.env = {**os.environ, "DATABASE_URL": self.db_url, "FLEETHQ_DATA_DIR": os.path.join(tmp, "master"),
                    "FLEETHQ_SECRET_KEY": "bench", "FLEETHQ_LOG_JSON": "false"}
        self.procs: dict[str, subprocess.Popen] = {}

    def close(self) -> None:
        stop(*self.procs.values())
        self.master.stop()

    def spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        log = open(os.path.join(self.tmp, f"{name}.log"), "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log)
        return self.procs[name]

    def worker(self, name: str, *, enroll: bool) -> str:
        """Start an OCR lane on its volume (enrolled and approved the first
        time); returns its worker id once its heartbeats carry its approval."""
        volume = os.path.join(self.tmp, name)
        env = {**os.environ, "DATABASE_URL": self.db_url, "FLEETHQ_OCR_JOBS": "1", "FLEETHQ_OCR_NICE": "0",
               "FLEETHQ_MIN_FREE_BYTES": "0"}
        if enroll:
            env["FLEETHQ_ENROLL"] = flask_cli(self.db_url, "enroll").splitlines()[-1]
        proc = self.spawn(name, [
            sys.executable, "-m", "workers.runner.cli", "run", "--master", self.master.base,
            "--volume", volume, "--project", PROJECT, "--task", "ocr", "--concurrency", "1",
            "--ocr-languages", "eng", "--allow-http", "--client-version", VERSION,
            "--heartbeat-seconds", "2", "--lease-seconds", "30", "--name", name], env)
        identity = os.path.join(volume, "identity.json")
        deadline = time.monotonic() + 60
        while not (os.path.exists(identity) and json.load(open(identity)).get("registered")):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the {name} lane did not register; see {name}.log")
            time.sleep(0.2)
        worker_id = json.load(open(identity))["worker_id"]
        if enroll:
            flask_cli(self.db_url, "worker", "approve", worker_id)
            if name == "fallback":
                flask_cli(self.db_url, "set-tier", worker_id, "fallback")
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not conn.execute("SELECT last_heartbeat_at > decided_at FROM fleet_nodes "
                                   "WHERE id = %s", (worker_id,)).fetchone()[0]:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"the {name} lane did not see its approval; see {name}.log")
                time.sleep(0.1)
        return worker_id

    def setup(self) -> dict[str, str]:
        self.admin.put(f"{self.master.base}/api/v1/fleethq/projects/{PROJECT}", json={
            "kind": "documents", "client_versions": [VERSION],
            "retry_backoff_seconds": 2}).raise_for_status()
        self.spawn("consume", [sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "documents",
                               "consume", "--folder", self.folder, "--project", PROJECT], self.env)
        ids = {"remote": self.worker("remote", enroll=True)}
        stop(self.procs.pop("remote"))  # the OCR host goes to sleep
        ids["fallback"] = self.worker("fallback", enroll=True)
        deadline = time.monotonic() + 30
        while not os.path.isdir(os.path.join(self.folder, "done")):
            if time.monotonic() > deadline:
                raise SystemExit("the consume process did not start; see consume.log")
            time.sleep(0.1)
        return ids

    def documents(self) -> list[dict]:
        listed = self.admin.get(f"{self.master.base}/api/v1/fleethq/projects/{PROJECT}/documents",
                                params={"limit": 200}).json()
        return listed["documents"]

    def run(self, documents, sleep_s: float) -> float:
        """Seconds from the first drop until every document is done."""
        began = time.perf_counter()
        for path, _ in documents:
            name = os.path.basename(path)
            part = os.path.join(self.folder, "." + name)
            shutil.copyfile(path, part)
            os.rename(part, os.path.join(self.folder, name))  # whole at once, as a scanner's rename
        woken = False
        deadline = time.monotonic() + 120 + 180 * len(documents)
        while True:
            if not woken and time.perf_counter() - began >= sleep_s:
                self.worker("remote", enroll=False)  # the host wakes
                woken = True
            docs = self.documents()
            if len(docs) >= len(documents) and all(d["state"] in ("done", "failed") for d in docs):
                return time.perf_counter() - began
            if time.monotonic() > deadline:
                raise SystemExit(f"not finished: {[d['state'] for d in docs]}; see the logs")
            time.sleep(0.2)

    def shares(self, ids: dict[str, str]) -> dict[str, int]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            rows = conn.execute("SELECT worker_id, count(*) FROM uploads WHERE project_id = %s "
                                "AND state = 'done' GROUP BY worker_id", (PROJECT,)).fetchall()
            by_worker = dict(rows)
            duplicates = conn.execute(
                "SELECT count(*) FROM (SELECT job_id FROM uploads WHERE project_id = %s AND state = 'done' "
                "GROUP BY job_id HAVING count(*) > 1) d", (PROJECT,)).fetchone()[0]
            duplicates += conn.execute(
                "SELECT count(*) - count(DISTINCT sha256) FROM documents WHERE project_id = %s",
                (PROJECT,)).fetchone()[0]
        return {"remote": by_worker.get(ids["remote"], 0), "fallback": by_worker.get(ids["fallback"], 0),
                "duplicates": duplicates}

    def searchable(self, documents) -> int:
        found = 0
        names = {d["document_id"]: d["filename"] for d in self.documents()}
        for path, words in documents:
            hits = 0
            for word in words:
                answer = self.admin.get(f"{self.master.base}/api/v1/fleethq/documents/search",
                                        params={"q": word}).json()
                hits += any(names.get(h["document_id"]) == os.path.basename(path)
                            for h in answer.get("results", []))
            found += hits == len(words)
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=24)
    parser.add_argument("--pages", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=8.0,
                        help="seconds the remote OCR host stays down after the drop")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="fleethq-bench-documents-")
    pages = args.documents * args.pages
    try:
        documents = make_documents(tmp, args.documents, args.pages)
        scratch = os.path.join(tmp, "direct")
        os.makedirs(scratch)
        before_s = direct(documents, scratch)
        print(f"direct: {pages} pages in {before_s:.1f} s", flush=True)
        stack = Stack(tmp)
        try:
            ids = stack.setup()
            whole_s = stack.run(documents, args.sleep)
            print(f"whole path: {pages} pages in {whole_s:.1f} s", flush=True)
            docs = stack.documents()
            shares = stack.shares(ids)
            searchable = stack.searchable(documents)
            folder = stack.folder
            dropped = {os.path.basename(p) for p, _ in documents}
            settled = set(os.listdir(os.path.join(folder, "done"))) | {
                n for n in os.listdir(os.path.join(folder, "failed")) if not n.endswith(".reason.txt")}
            lost = len(dropped - settled) + len(dropped - {d["filename"] for d in docs})
        finally:
            stack.close()
        after_s = direct(documents, scratch)
        print(f"direct again: {pages} pages in {after_s:.1f} s", flush=True)
        direct_s = (before_s + after_s) / 2
    except (requests.RequestException, subprocess.CalledProcessError) as exc:
        print(f"documents error={type(exc).__name__}: {str(exc)[:300]}")
        raise SystemExit(1) from None
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    done = sum(d["state"] == "done" for d in docs)
    failed = sum(d["state"] == "failed" for d in docs)
    total = max(shares["remote"] + shares["fallback"], 1)
    rate, direct_rate = pages / whole_s * 60, pages / direct_s * 60
    print(f"documents n={args.documents} done={done} failed={failed} lost={lost} "
          f"duplicates={shares['duplicates']} searchable={searchable} "
          f"remote_share={shares['remote'] / total:.2f} fallback_share={shares['fallback'] / total:.2f} "
          f"pages_per_min={rate:.1f} direct_pages_per_min={direct_rate:.1f} ratio={rate / direct_rate:.2f}")


if __name__ == "__main__":
    main()
