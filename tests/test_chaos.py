"""``bench/chaos.py --quick``: the whole system under every kind of fault, in make test.

The run starts its own PostgreSQL, Redis, object store and master, so the
faults it injects (PostgreSQL and Redis restarts among them) touch nothing
else of the test session. Its invariants are checked by the script itself
straight in PostgreSQL, the store and the disks; this test holds it to them.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes  # bench/chaos.py starts the whole system

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_chaos_run_keeps_every_invariant():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "chaos.py"), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, output[-6000:]
    figures = dict(re.findall(r"(\w+)=(\d+)", last))
    assert last.startswith("chaos "), last
    for invariant in ("duplicates", "lost", "spool_left", "counter_drift", "unexplained", "undelivered"):
        assert figures[invariant] == "0", (invariant, last)
    assert int(figures["jobs"]) == 2150 + 2 * 6 and int(figures["failed"]) == 3, last
    assert int(figures["ocr_done"]) == 6, last
    assert int(figures["done"]) + int(figures["failed"]) == int(figures["jobs"]), last
    # Every kind of fault happened at least once.
    kinds = re.search(r"faults: ([a-z_, 0-9]+);", output)
    assert kinds, output[-3000:]
    assert set(kinds[1].split(", ")) >= {"kill_worker", "kill_web", "kill_tasks", "kill_clock",
                                         "restart_redis", "restart_postgres", "store_down",
                                         "spool_full", "hook_500"}, kinds[1]
