"""bench/netfaults.py: the fleet through a faulty network (issue 26 §6).

The quick run (its own PostgreSQL, Redis, store and master; every worker
kind behind bench/faultnet.py) must keep every invariant; and the history
checker must catch each kind of violation it claims to, shown here on
histories made by hand.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(ROOT, "bench"))

from netfaults import check_history  # noqa: E402  (bench/ is not a package)

KINDS = {"drop_request", "lost_ack", "duplicate", "late", "delay", "reset_upload", "partition_reset",
         "partition_blackhole"}


@pytest.mark.processes
def test_quick_netfaults_run_keeps_every_invariant():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "netfaults.py"), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, output[-6000:]
    assert last.startswith("netfaults "), last
    figures = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", last)}
    for invariant in ("lost_acked", "double_accepted", "duplicates", "unfinished"):
        assert figures[invariant] == 0, (invariant, last)
    assert figures["history_ok"] == 1, last
    assert figures["jobs"] == 80 + 6000 + 2 * 3 and figures["ops"] > 3000, last
    # Every kind of network fault happened, and PostgreSQL restarted.
    injected = re.findall(r"faults: .*; injected (\{[^}]*\})", output)
    assert injected, output[-3000:]
    counts = json.loads(injected[-1].replace("'", '"'))
    assert set(counts) >= KINDS, counts
    assert "restart_postgres" in output


# ---------------------------------------------------------------- the checker

def history(tmp_path, *entries) -> str:
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"i": n, **e}) + "\n" for n, e in enumerate(entries, 1)))
    return str(path)


def claim(t1, *jobs):
    return {"op": "claim", "s": 200, "d": True, "t0": t1 - 0.01, "t1": t1, "jobs": [list(j) for j in jobs]}


def complete(t0, job, attempt, delivered=True, result="applied"):
    return {"op": "complete", "s": 200, "d": delivered, "t0": t0, "t1": t0 + 0.01,
            "items": [[job, attempt, "success"]], "results": [[job, attempt, result, "done", None]]}


def fail(t0, job, attempt):
    return {"op": "fail", "s": 200, "d": True, "t0": t0, "t1": t0 + 0.01,
            "items": [[job, attempt, True]], "results": [[job, attempt, "applied", "todo", None]]}


def final(done=None, jobs=None, uploads=None):
    done = done or {}
    return {"jobs": jobs or {job: "done" for job in done}, "done_by": {j: {a} for j, a in done.items()},
            "uploads": uploads or {}, "attempt_job": {}}


def test_a_clean_history_passes(tmp_path):
    out = check_history(history(tmp_path, claim(100, (1, "a1", 130)), complete(105, 1, "a1")),
                        final({1: "a1"}))
    assert (out["ops"], out["lost_acked"], out["double_accepted"], out["history_ok"]) == (2, 0, 0, 1)


def test_an_acknowledged_completion_missing_at_the_end_is_lost(tmp_path):
    out = check_history(history(tmp_path, claim(100, (1, "a1", 130)), complete(105, 1, "a1")),
                        final(jobs={1: "todo"}))
    assert (out["lost_acked"], out["history_ok"]) == (1, 0)
    # Not acknowledged (the answer was lost): the worker knows nothing, nothing is owed.
    out = check_history(history(tmp_path, claim(100, (1, "a1", 130)), complete(105, 1, "a1", delivered=False)),
                        final(jobs={1: "todo"}))
    assert (out["lost_acked"], out["history_ok"]) == (0, 1)


def test_a_second_lease_while_the_first_is_live_breaks_the_history(tmp_path):
    out = check_history(history(tmp_path, claim(100, (1, "a1", 130)), claim(110, (1, "a2", 140))), final())
    assert out["history_ok"] == 0 and out["_history"]["overlaps"][0][:3] == (1, "a1", "a2")
    # Once the first has ended (a failure) or expired, a second lease is fine.
    ended = check_history(history(tmp_path, claim(100, (1, "a1", 130)), fail(105, 1, "a1"),
                                  claim(110, (1, "a2", 140))), final())
    expired = check_history(history(tmp_path, claim(100, (1, "a1", 130)), claim(131, (1, "a2", 160))), final())
    assert ended["history_ok"] == expired["history_ok"] == 1
    # A renewal keeps the first alive past its first expiry.
    renewed = check_history(history(tmp_path, claim(100, (1, "a1", 130)),
                                    {"op": "heartbeat", "s": 200, "d": True, "t0": 120, "t1": 120,
                                     "leases": {"a1": 200}},
                                    claim(150, (1, "a2", 180))), final())
    assert renewed["history_ok"] == 0


def test_one_job_acknowledged_to_two_attempts_is_double_accepted(tmp_path):
    out = check_history(history(tmp_path, claim(100, (1, "a1", 130)), complete(105, 1, "a1"),
                                claim(140, (1, "a2", 170)), complete(145, 1, "a2")),
                        {"jobs": {1: "done"}, "done_by": {1: {"a1", "a2"}}, "uploads": {}, "attempt_job": {}})
    assert (out["double_accepted"], out["history_ok"]) == (1, 0)
