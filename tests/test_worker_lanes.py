"""Several real ``fleethq-worker`` processes on one queue (DESIGN lanes):
failover after a kill -9, capacity shared under the project caps, a
fallback node that waits while the first-choice node keeps up and takes over
when it stops, and the local fetcher (``flask fleet local-worker``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from tests.helpers import VERSION
from tests.worker_harness import (ROOT, WorkerProcess, archiver, fleet, master,  # noqa: F401
                                  publisher, sql, wait_for)

# The harness's workers long-poll with the runner's solo wait (10 s).
LONG_POLL_S = 10


def attempts_by_worker(app, project: str) -> dict[str, int]:
    rows = sql(app, "SELECT worker_id, count(*) AS n FROM attempts WHERE project_id = :p "
                    "AND state <> 'cancelled' GROUP BY worker_id", p=project)
    return {r["worker_id"]: r["n"] for r in rows}


def set_tier(app, worker_id: str, tier: str) -> None:
    out = app.test_cli_runner().invoke(args=["fleet", "set-tier", worker_id, tier])
    assert out.exit_code == 0, out.output


def test_the_other_worker_finishes_the_jobs_of_one_killed_mid_download(fleet, publisher,
                                                                       monkeypatch):
    # Heartbeats renew leases by NODE_LEASE_S: short, so the dead worker's
    # leases run out within seconds.
    monkeypatch.setitem(fleet.app.config, "NODE_LEASE_S", 6)
    project = fleet.project(max_resets=3)
    values = [f"{publisher.url}/slow/{n}?delay=3" for n in range(1, 3)]
    fleet.enqueue(project, values)
    doomed = fleet.worker(project, FLEETHQ_LEASE_SECONDS=15)  # the shortest it takes
    wait_for(lambda: doomed.states().get("downloading") == 2, 30,
             f"two downloads in flight: {doomed.states()}\n{doomed.output()}")
    survivor = fleet.worker(project)  # both run now; every job is the doomed one's
    survivor_id = survivor.identity()["worker_id"]
    doomed.kill9()

    counts = fleet.wait_settled(project, len(values), timeout=90, proc=survivor)
    assert counts["done"] == len(values), survivor.output()[-4000:]
    fleet.archived_once(project)
    done_by = {r["worker_id"] for r in sql(fleet.app, "SELECT worker_id FROM uploads "
                                           "WHERE project_id = :p AND state = 'done'", p=project)}
    assert done_by == {survivor_id}


def test_two_and_three_workers_share_the_queue_under_the_project_cap(fleet, publisher):
    cap = 3
    project = fleet.project(max_in_flight=cap, max_worker_in_flight=2)
    values = [f"{publisher.url}/slow/{n}?delay=1" for n in range(1, 13)]
    workers = [fleet.worker(project) for _ in range(3)]  # 2 slots each: 6 > the cap of 3
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            row = sql(fleet.app, "SELECT count(*) AS n FROM jobs WHERE project_id = :p AND "
                                 "(state = 'staged' OR (state = 'wip' AND lease_expires_at > now()))",
                      p=project)[0]
            peak[0] = max(peak[0], row["n"])
            stop.wait(0.05)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    fleet.enqueue(project, values)
    try:
        counts = fleet.wait_settled(project, len(values), timeout=120, proc=workers[0])
    finally:
        stop.set()
        sampler.join(5)
    assert counts["done"] == len(values)
    fleet.archived_once(project)
    assert 2 <= peak[0] <= cap  # in flight at once, never past the cap
    busy = attempts_by_worker(fleet.app, project)
    assert len(busy) >= 2, busy  # the work was shared


def test_a_fallback_node_waits_while_the_first_choice_keeps_up_then_takes_over(fleet, publisher):
    fallback_after = 3
    # Remote first: both remote nodes start on tier auto, so first choice
    # there until one is pinned fallback.
    project = fleet.project(fallback_after_seconds=fallback_after, lane_order="remote_first")
    first = fleet.worker(project, FLEETHQ_CONCURRENCY=4)
    second = fleet.worker(project)
    first_id, second_id = first.identity()["worker_id"], second.identity()["worker_id"]
    set_tier(fleet.app, second_id, "fallback")
    wait_for(lambda: sql(fleet.app, "SELECT 1 FROM fleet_nodes WHERE id = :n AND "
                                    "last_heartbeat_at > now() - interval '5 seconds'", n=first_id),
             30, f"the first-choice node's heartbeat\n{first.output()}")
    # Two rounds the first-choice node can take at once (4 slots, 2 papers each).
    for round_ in range(2):
        values = [f"{publisher.url}/papers/{10 * round_ + n}.pdf" for n in range(1, 3)]
        fleet.enqueue(project, values)
        fleet.wait_settled(project, 2 * (round_ + 1), timeout=60, proc=first)
    assert attempts_by_worker(fleet.app, project) == {first_id: 4}  # the fallback stayed idle

    first.kill9()  # a crash: its heartbeat still looks fresh, only the wait rule helps
    fleet.enqueue(project, [f"{publisher.url}/papers/{n}.pdf" for n in (31, 32)])
    counts = fleet.wait_settled(project, 6, timeout=60, proc=second)
    assert counts["done"] == 6
    taken = sql(fleet.app, "SELECT extract(epoch FROM a.created_at - j.created_at) AS waited "
                           "FROM attempts a JOIN jobs j ON j.id = a.job_id "
                           "WHERE a.project_id = :p AND a.worker_id = :w", p=project, w=second_id)
    assert len(taken) == 2
    for row in taken:  # taken over within fallback_after_seconds + one long poll
        assert fallback_after <= float(row["waited"]) <= fallback_after + LONG_POLL_S + 2


def test_a_first_choice_node_that_stops_cleanly_signs_off_and_the_fallback_takes_over_at_once(
        fleet, publisher):
    """A host going to sleep stops its worker (SIGTERM): the last heartbeat
    offers no slot, so the fallback does not wait fallback_after_seconds."""
    fallback_after = 30
    project = fleet.project(fallback_after_seconds=fallback_after, lane_order="remote_first")
    first = fleet.worker(project, FLEETHQ_CONCURRENCY=2)
    second = fleet.worker(project)
    first_id, second_id = first.identity()["worker_id"], second.identity()["worker_id"]
    set_tier(fleet.app, second_id, "fallback")
    wait_for(lambda: sql(fleet.app, "SELECT 1 FROM fleet_nodes WHERE id = :n AND capacity = 2 AND "
                                    "last_heartbeat_at > now() - interval '5 seconds'", n=first_id),
             30, f"the first-choice node's heartbeat\n{first.output()}")
    assert first.terminate() == 0
    assert sql(fleet.app, "SELECT capacity FROM fleet_nodes WHERE id = :n", n=first_id) == [{"capacity": 0}]
    fleet.enqueue(project, [f"{publisher.url}/papers/{n}.pdf" for n in (41, 42)])
    assert fleet.wait_settled(project, 2, timeout=60, proc=second)["done"] == 2
    taken = sql(fleet.app, "SELECT extract(epoch FROM a.created_at - j.created_at) AS waited "
                           "FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.project_id = :p", p=project)
    assert len(taken) == 2 and all(float(r["waited"]) < fallback_after / 2 for r in taken), taken
    assert attempts_by_worker(fleet.app, project) == {second_id: 2}


# ------------------------------------------------------------ local fetcher

class Fetcher(WorkerProcess):
    """``flask --app wsgi fleet local-worker`` with the test master's settings."""

    def __init__(self, fleet, volume, project: str, log, *extra: str):
        super().__init__(fleet.master, volume, [project], log,
                         publisher_networks=fleet.publisher_networks())
        self.env = {**os.environ, **self.env}  # the master's settings: database, secret key
        self.args = ["--volume", str(volume), "--master-url", fleet.master.url,
                     "--concurrency", "2", *extra, "--",
                     "--project", project, "--client-version", VERSION]

    def start(self) -> "Fetcher":
        out = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "wsgi", "fleet",
                                      "local-worker", *self.args], cwd=ROOT, env=self.env,
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        return self


def test_the_local_fetcher_approves_itself_once_and_works_while_remote_is_off(fleet, publisher):
    project = fleet.project()
    fetcher = Fetcher(fleet, fleet.tmp_path / "fetcher", project, fleet.tmp_path / "fetcher.log",
                      "--tier", "fallback")
    fleet.workers.append(fetcher)
    fetcher.start()
    ident = wait_for(lambda: (fetcher.identity() or {}).get("registered") and fetcher.identity(),
                     30, f"the fetcher's identity\n{fetcher.output()}")
    nodes = sql(fleet.app, "SELECT id, status, tier, local FROM fleet_nodes")
    assert [tuple(n.values()) for n in nodes] == [(ident["worker_id"], "active", "fallback", True)]
    out = fleet.app.test_cli_runner().invoke(args=["fleet", "remote", "off"])
    assert out.exit_code == 0, out.output
    values = [f"{publisher.url}/papers/{n}.pdf" for n in range(1, 4)]
    fleet.enqueue(project, values)
    # No other worker: a fallback node is not held back, and the switch never stops it.
    counts = fleet.wait_settled(project, len(values), timeout=60, proc=fetcher)
    assert counts["done"] == len(values), fetcher.output()[-4000:]
    fleet.archived_once(project)

    # A restart reuses the credential in its volume: the same node, no new one.
    assert fetcher.terminate() == 0
    fetcher.args = [a for a in fetcher.args if a not in ("--tier", "fallback")]
    fetcher.start()
    wait_for(lambda: len(_json_blocks(fetcher.output())) == 2, 30,
             f"the second start\n{fetcher.output()}")
    nodes = sql(fleet.app, "SELECT id, tier, local FROM fleet_nodes")
    assert [tuple(n.values()) for n in nodes] == [(ident["worker_id"], "fallback", True)]
    fleet.enqueue(project, [f"{publisher.url}/papers/9.pdf"])
    assert fleet.wait_settled(project, 4, timeout=60, proc=fetcher)["done"] == 4
    printed = [json.loads(block) for block in _json_blocks(fetcher.output())]
    assert [p["created"] for p in printed] == [True, False]
    # The same process became fleethq-worker, without the master's database or secrets.
    environ = open(f"/proc/{fetcher.proc.pid}/environ", "rb").read().split(b"\0")
    assert not [v for v in environ if v.startswith((b"DATABASE_URL=", b"FLEETHQ_SECRET_KEY"))]
    assert b"workers.runner.cli" in open(f"/proc/{fetcher.proc.pid}/cmdline", "rb").read()


def _json_blocks(output: str) -> list[str]:
    """The JSON objects local-worker printed (indented, one per start)."""
    blocks, current = [], None
    for line in output.splitlines():
        if line == "{":
            current = [line]
        elif current is not None:
            current.append(line)
            if line == "}":
                blocks.append("\n".join(current))
                current = None
    return blocks
