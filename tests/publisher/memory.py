"""Measure the Python memory a fetch needs, in processes of their own.

The publisher runs in one child process and the fetch in another, so that
neither the server's buffers nor other tests' leftover threads count in the
tracemalloc peak: only the fetching code is measured.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, sys, tracemalloc
from workers.fetch import FetchConfig, browser, fetch_document
from workers.fetch.chromium import thread_browser
args = json.loads(sys.argv[1])
cfg = FetchConfig(**args["cfg"])
if args["lane"] == "browser":
    thread_browser(cfg)          # Playwright's start-up is not what is measured
tracemalloc.start()
if args["lane"] == "browser":
    path, info, source, strategy, details = browser.fetch_with_browser(args["url"], args["dest"], cfg)
    out = {"ok": True, "sha256": info.sha256, "size": info.size, "strategy": strategy}
else:
    r = fetch_document(args["url"], args["dest"], cfg)
    out = {"ok": r.ok, "sha256": r.sha256, "size": r.size, "strategy": r.strategy, "error": r.message}
out["peak"] = tracemalloc.get_traced_memory()[1]
print(json.dumps(out))
"""


def serve_in_child(*args: str):
    """Start ``python -m tests.publisher ARGS``; return (process, its JSON info)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.publisher", *args], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return proc, json.loads(proc.stdout.readline())


def stop_child(proc) -> None:
    proc.stdin.close()
    proc.wait(10)


def fetch_peak(url: str, dest: str, lane: str = "ladder", **cfg) -> dict:
    """Fetch ``url`` in a fresh interpreter; its result plus ``peak`` (bytes)."""
    arg = json.dumps({"url": url, "dest": dest, "lane": lane, "cfg": cfg})
    done = subprocess.run([sys.executable, "-c", _CHILD, arg], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"fetch child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
