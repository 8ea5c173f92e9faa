"""The whole fleet through a faulty network, and a check of what it saw.

The system of bench/chaos.py (its own PostgreSQL, Redis, S3 store, gunicorn
web, tasks, the publisher and a hook consumer; enrolled download nodes, an
OCR node, the local download and OCR lanes, SDK workers and workers that
speak SavewebHQ's wire), but every worker reaches the master through
bench/faultnet.py: requests dropped, answers dropped after the master
committed (lost ACKs), requests duplicated, delivered late (after the
worker's retry), delayed, uploads reset half-way, and partitions of the
whole fleet (connections reset, or held silent) for seconds in the quick
run and minutes in the full one; PostgreSQL restarts on top.

Every exchange is recorded. Once the queues settle, a checker reads the
history beside the database's final state and proves:

- ``lost_acked``: every completion, upload or receipt a worker was told
  succeeded is there at the end (its job done, by that attempt);
- ``double_accepted``: no job was acknowledged to two different attempts;
- ``duplicates``: no job done twice (two done attempts, two done uploads,
  two assets), as bench/chaos.py counts them;
- ``unfinished``: every job ended;
- ``history_ok``: no lease was granted while another attempt's lease on the
  same job was surely live (granted before the answer came, the other one
  neither expired nor ended by then, renewals included).

Last line: ``netfaults ops=… jobs=… faults=… lost_acked=0 double_accepted=0
duplicates=0 unfinished=0 history_ok=1``; exit status 1 when a check fails.
``--quick`` is the short run make test does (tests/test_netfaults.py).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import defaultdict

from chaos import Chaos, log, wait_until
from faultnet import FaultyNet, History

# A lease seen from both sides of the proxy: the master's expiry is whole
# seconds; the proxy's clock is the same host's.
TOLERANCE_S = 1.0
NET_FAULTS = ("partition_reset", "partition_blackhole", "restart_postgres")


class NetFaults(Chaos):

    def run(self) -> dict:
        self.start_services()
        self.start_master()
        self.set_up_work()
        self.history = History(os.path.join(self.tmp, "history.jsonl"))
        # Faults only once the fleet has enrolled (registration is not what is tested).
        self.net = FaultyNet(self.port, self.history, seed=self.args.seed, rate=0.0).start()
        self.fleet_url = self.net.url
        began = time.monotonic()
        self.start_fleet()
        self.net.rate = self.args.rate
        stop = self.stop_faults
        faults = self.fault_thread = threading.Thread(target=self.run_net_faults, args=(stop,), daemon=True)
        faults.start()
        budget = self.args.minutes * 60
        last = 0.0
        while time.monotonic() - began < budget and faults.is_alive():
            time.sleep(1)
            if time.monotonic() - last > (10 if self.args.quick else 30):
                last = time.monotonic()
                log(f"ops {self.history.count}, injected {dict(self.net.injected)}; "
                    + ", ".join(f"{k} {v}" for k, v in sorted(self.progress().items())))
                if set(self.faults) >= set(NET_FAULTS) and self.work_done():
                    break
        stop.set()
        faults.join()
        self.net.rate = 0.0
        log(f"faults over ({len(self.faults)} scheduled, {sum(self.net.injected.values())} injected); settling")
        settle_by = time.monotonic() + self.args.settle * 60
        while not wait_until(self.settled, 10, "", interval=1, quiet=True):
            if time.monotonic() > settle_by:
                log(f"not settled within {self.args.settle} min")
                break
            log("progress: " + ", ".join(f"{k} {v}" for k, v in sorted(self.progress().items())))
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(len(self.fleet)) as pool:
            list(pool.map(lambda n: self.procs[n].stop(60), self.fleet))
        self.net.stop()   # after the late deliveries still under way
        self.history.close()
        if not self.settled():  # what a late delivery or the stop moved settles first
            wait_until(self.settled, self.args.settle * 60, "", interval=1, quiet=True)
        self.workers_s = time.monotonic() - began
        result = self.check()
        result["unfinished"] = self.query(
            "SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed', 'reset_exhausted')")[0][0]
        result.update(check_history(self.history.path, self.final_state()))
        return result

    def run_net_faults(self, stop: threading.Event) -> None:
        kinds = list(NET_FAULTS)
        self.rng.shuffle(kinds)
        low, high = (4, 8) if self.args.quick else (60, 180)
        partition_s = (6, 10) if self.args.quick else (60, 150)
        while not stop.is_set():
            if stop.wait(self.rng.uniform(low, high)):
                return
            kind = kinds.pop() if kinds else self.rng.choice(NET_FAULTS)
            began = time.monotonic()
            if kind.startswith("partition_"):
                seconds = self.rng.uniform(*partition_s)
                self.net.partition(seconds, kind[len("partition_"):])
                stop.wait(seconds)
                what = f"fleet cut off ({kind[len('partition_'):]}) for {seconds:.0f} s"
            else:
                what = self.inject(kind)
            self.faults.append(kind)
            log(f"fault {len(self.faults)}: {what} ({time.monotonic() - began:.1f} s)")
            if self.args.quick and not kinds:
                return

    def final_state(self) -> dict:
        """What the database says at the end, for the history check."""
        jobs = {job_id: state for job_id, state in self.query("SELECT id, state FROM jobs")}
        done_by = defaultdict(set)
        for job_id, attempt_id in self.query(
                "SELECT job_id, coalesce(wire_id, id::text) FROM attempts WHERE state = 'done'"):
            done_by[job_id].add(str(attempt_id))
        uploads = {str(a): state for a, state in self.query("SELECT attempt_id, state FROM uploads")}
        attempt_job = {str(a): j for a, j in self.query(
            "SELECT coalesce(wire_id, id::text), job_id FROM attempts")}
        return {"jobs": jobs, "done_by": done_by, "uploads": uploads, "attempt_job": attempt_job}


def check_history(path: str, final: dict) -> dict:
    """The history's invariants against the final state (see the module doc)."""
    grants = {}                       # attempt -> [job, answered at, expiry]
    ends = {}                         # attempt -> earliest request that ended it
    acked = defaultdict(set)          # job -> attempts a worker was told succeeded
    lost = []
    ops = 0
    with open(path) as fh:
        for line in fh:
            ops += 1
            e = json.loads(line)
            op, status, delivered = e.get("op"), e.get("s"), e.get("d")
            if op == "claim" and status == 200:
                for job, attempt, expiry in e.get("jobs", []):
                    grants[attempt] = [job, e["t1"], expiry or 0]
            elif op in ("complete", "fail", "extend-lease") and status == 200:
                kinds = {(str(a)): k for _, a, k in e.get("items", [])}
                for job, attempt, result, _job_status, expiry in e.get("results", []):
                    if result != "applied":
                        continue
                    if op == "extend-lease":
                        if attempt in grants and expiry:
                            grants[attempt][2] = max(grants[attempt][2], expiry)
                        continue
                    ends[attempt] = min(ends.get(attempt, e["t0"]), e["t0"])
                    if op == "complete" and kinds.get(attempt) == "success" and delivered:
                        acked[job].add(attempt)
                        if final["jobs"].get(job) != "done" or attempt not in final["done_by"].get(job, ()):
                            lost.append(("complete", job, attempt))
            elif op == "heartbeat" and status == 200:
                for attempt, expiry in (e.get("leases") or {}).items():
                    if attempt in grants and expiry:
                        grants[attempt][2] = max(grants[attempt][2], expiry)
            elif op == "skip" and status is not None and status < 300:
                ends[e["attempt"]] = min(ends.get(e["attempt"], e["t0"]), e["t0"])
            elif op in ("upload", "receipt") and status is not None and status < 300 and delivered:
                attempt, state = e["attempt"], e.get("state")
                if op == "upload" or state == "done":
                    job = e.get("job") or final["attempt_job"].get(attempt)
                    acked[job].add(attempt)
                    if final["uploads"].get(attempt) != "done" or attempt not in final["done_by"].get(job, ()):
                        lost.append((op, job, attempt))
    # A second lease on a job while the first was surely live: the second
    # was granted before its answer came (t1); the first lived at least until
    # its expiry or the request that ended it, whichever came first.
    by_job = defaultdict(list)
    for attempt, (job, granted, expiry) in grants.items():
        by_job[job].append((granted, attempt, expiry))
    overlaps = []
    for job, leases in by_job.items():
        leases.sort()
        for (_g1, a1, x1), (g2, a2, _x2) in zip(leases, leases[1:]):
            live_until = min(x1, ends.get(a1, float("inf")))
            if g2 < live_until - TOLERANCE_S:
                overlaps.append((job, a1, a2, round(live_until - g2, 2)))
    double = [job for job, attempts in acked.items() if len(attempts) > 1]
    return {"ops": ops, "lost_acked": len(lost), "double_accepted": len(double),
            "history_ok": int(not overlaps and not lost and not double),
            "_history": {"lost": lost[:10], "double": double[:10], "overlaps": overlaps[:10],
                         "grants": len(grants), "acknowledged": sum(len(a) for a in acked.values())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short run make test does")
    parser.add_argument("--pdf-jobs", type=int, default=None)
    parser.add_argument("--generic-jobs", type=int, default=None)
    parser.add_argument("--ocr-jobs", type=int, default=None)
    parser.add_argument("--generic-workers", type=int, default=None, help="SDK and raw workers, each")
    parser.add_argument("--rate", type=float, default=None, help="share of requests given a fault")
    parser.add_argument("--minutes", type=float, default=None, help="at most this long with faults")
    parser.add_argument("--settle", type=float, default=None, help="then at most this long to settle")
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument("--keep", action="store_true", help="keep the logs and history even when all is well")
    args = parser.parse_args()
    defaults = ({"pdf_jobs": 80, "generic_jobs": 6000, "ocr_jobs": 3, "generic_workers": 1, "rate": 0.05,
                 "minutes": 1.5, "settle": 3}
                if args.quick else
                # About a million recorded exchanges (most of them one
                # completion per generic job), an hour or more on two cores.
                {"pdf_jobs": 2000, "generic_jobs": 950000, "ocr_jobs": 30, "generic_workers": 6, "rate": 0.03,
                 "minutes": 120, "settle": 10})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    # A SIGTERM (a timeout around the run) still stops everything it started;
    # a second one (timeout(1) forwards its own) must not cut that short.
    def stop_on_term(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop_on_term)
    args.faults = 0
    args.complete_each = True   # SavewebHQ's Go SDK pattern: one completion request per job
    run = NetFaults(args)
    result, ok = None, False
    try:
        result = run.run()
        ok = result["history_ok"] == 1 and all(result[k] == 0 for k in (
            "lost_acked", "double_accepted", "duplicates", "unfinished", "lost", "spool_left", "counter_drift",
            "unexplained", "undelivered"))
    finally:
        run.close(keep=args.keep or not ok)
    detail = {**result.pop("_detail"), **result.pop("_history")}
    if not ok:
        print(json.dumps(detail, default=str, indent=1)[:4000], flush=True)
    injected = dict(run.net.injected)
    log(f"faults: {', '.join(run.faults)}; injected {injected}; fleet work took {run.workers_s:.0f} s")
    log("also: " + " ".join(f"{k}={result[k]}" for k in ("done", "failed", "lost", "spool_left", "counter_drift",
                                                          "unexplained", "undelivered"))
        + f" leases={detail['grants']} acknowledged={detail['acknowledged']}")
    # Partitions are counted once (the proxy's count), PostgreSQL restarts beside them.
    faults = sum(injected.values()) + run.faults.count("restart_postgres")
    print(f"netfaults ops={result['ops']} jobs={result['jobs']} faults={faults} "
          f"lost_acked={result['lost_acked']} double_accepted={result['double_accepted']} "
          f"duplicates={result['duplicates']} unfinished={result['unfinished']} history_ok={result['history_ok']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
