"""The master goes away, refuses uploads, withdraws a lease, or revokes the
worker; ready files past their retention.

The outage lasts ~20 s here instead of the issue's two minutes: what matters
is that the leases run out meanwhile (node lease shortened to 10 s, claim
lease 15 s), so the delivery afterwards goes through the master's late-upload
rule (DESIGN §8.1) exactly as after a long outage.
"""
from __future__ import annotations

import time

from tests.worker_harness import (archiver, fleet, master, publisher, sql,  # noqa: F401
                                       wait_for)
from tests.fleet_helpers import decide
from workers.runner import EXIT_REVOKED

OUTAGE_S = 20


def test_master_outage_keeps_ready_files_and_delivers_them_late(app, fleet, publisher, master,
                                                               monkeypatch):
    monkeypatch.setitem(app.config, "NODE_LEASE_S", 10)
    values = [f"{publisher.url}/slow/{n}?delay=3" for n in range(1, 5)]
    project = fleet.project()
    fleet.enqueue(project, values)
    worker = fleet.worker(project, FLEETHQ_LEASE_SECONDS=15)
    wait_for(lambda: worker.states().get("downloading") == 2, 30, f"downloads: {worker.states()}")
    master.stop()
    down_since = time.monotonic()

    # The downloads finish while nobody answers: the files wait on the volume.
    wait_for(lambda: worker.states().get("ready") == 2, 20, f"ready files: {worker.states()}")
    held = sorted(e["attempt_id"] for e in worker.journal().values() if e["state"] == "ready")
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_since)))
    assert worker.proc.poll() is None, worker.output()[-3000:]
    assert worker.states().get("ready") == 2 and len(worker.files()) == 2
    lapsed = sql(app, "SELECT count(*) AS n FROM attempts WHERE id = ANY(:ids) "
                      "AND lease_expires_at < now()", ids=[int(a) for a in held])[0]["n"]
    assert lapsed == 2, "the leases should have run out during the outage"

    master.start()
    counts = fleet.wait_settled(project, len(values), timeout=120, proc=worker)
    assert counts["done"] == len(values), worker.output()[-4000:]
    fleet.archived_once(project)
    # The very attempts held through the outage were accepted late and archived.
    done = sql(app, "SELECT attempt_id::text AS a FROM uploads WHERE state = 'done' "
                    "AND attempt_id = ANY(:ids)", ids=[int(a) for a in held])
    assert sorted(r["a"] for r in done) == held
    wait_for(lambda: worker.files() == [], 15, f"an empty volume: {worker.files()}")
    assert worker.terminate() == 0


def test_revoked_worker_stops_cleanly_and_keeps_its_ready_files(app, fleet, publisher, master):
    master.refuse_uploads = (507, "spool_full")   # the ready files stay on the volume
    values = [p.value for p in publisher.papers(2)]
    project = fleet.project()
    fleet.enqueue(project, values)
    worker = fleet.worker(project)
    wait_for(lambda: worker.states().get("ready") == 2, 60, f"ready files: {worker.states()}")
    wait_for(lambda: "delivery deferred" in worker.output(), 30, "a deferred upload")
    node_id = worker.identity()["worker_id"]

    assert decide(app, node_id, "revoke") == "revoked"
    assert worker.proc.wait(30) == EXIT_REVOKED
    out = worker.output()
    assert "revoked or rejected" in out and "2 ready file(s) are kept" in out
    assert len(worker.files()) == 2 and worker.states() == {"ready": 2}
    # Revoking cancelled the running attempts on the master.
    states = {r["state"] for r in sql(app, "SELECT state FROM attempts WHERE project_id = :p",
                                      p=project)}
    assert states == {"cancelled"}

    # A restart on that volume stops at once with the same exit code.
    worker.start()
    assert worker.proc.wait(30) == EXIT_REVOKED


def test_download_the_master_no_longer_leases_is_cancelled(app, fleet, publisher):
    project = fleet.project()
    fleet.enqueue(project, [f"{publisher.url}/slow/1?delay=4"])
    worker = fleet.worker(project)
    wait_for(lambda: worker.states().get("downloading") == 1, 30, f"a download: {worker.states()}")
    first = next(iter(worker.journal()))
    # The lease runs out on the master (as if heartbeats had been lost): the
    # next heartbeat no longer lists the attempt, and the worker drops it.
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
             "WHERE current_attempt_id = :a", a=int(first))
    wait_for(lambda: f"attempt {first} is no longer leased by the master: cancelled" in worker.output(),
             20, "the cancellation")
    counts = fleet.wait_settled(project, 1, timeout=60, proc=worker)
    assert counts["done"] == 1
    fleet.archived_once(project)
    assert worker.journal()[first]["state"] == "failed"
    assert worker.journal()[first]["error"]["code"] == "cancelled"
    # Only the newer attempt uploaded; the cancelled download was discarded.
    uploads = sql(app, "SELECT attempt_id::text AS a FROM uploads WHERE project_id = :p", p=project)
    assert [u["a"] for u in uploads] != [first] and len(uploads) == 1
    assert worker.files() == [] or wait_for(lambda: worker.files() == [], 15, "an empty volume")
    assert worker.terminate() == 0


def test_upload_refused_for_good_is_reported_invalid_pdf_and_the_file_deleted(app, fleet, publisher,
                                                                             master):
    master.refuse_uploads = (422, "invalid_upload")
    project = fleet.project()
    fleet.enqueue(project, [publisher.papers(1)[0].value])
    worker = fleet.worker(project)
    counts = fleet.wait_settled(project, 1, timeout=60, proc=worker)
    assert counts["failed"] == 1, counts          # invalid_pdf is not retryable
    row = sql(app, "SELECT last_error->>'code' AS code FROM jobs WHERE project_id = :p", p=project)[0]
    assert row["code"] == "invalid_pdf"
    wait_for(lambda: worker.files() == [], 15, f"the file deleted: {worker.files()}")
    assert worker.terminate() == 0


def test_ready_files_past_their_retention_are_dropped_with_a_log_line(fleet, publisher, master):
    master.refuse_uploads = (507, "spool_full")   # never delivered
    project = fleet.project()
    fleet.enqueue(project, [publisher.papers(1)[0].value])
    worker = fleet.worker(project, FLEETHQ_RETENTION_HOURS="0.002")   # 7.2 s instead of 24 h
    wait_for(lambda: "without an archive receipt" in worker.output(), 60, "the retention drop")
    wait_for(lambda: worker.files() == [], 15, f"the file dropped: {worker.files()}")
    assert "without an archive receipt (limit 7 s)" in worker.output()
    assert worker.terminate() == 0


def test_a_worker_newer_than_its_master_leaves_the_projects_out_of_its_heartbeats(
        app, fleet, publisher, master):
    """A master from before heartbeats carried ``projects`` refuses the field:
    the worker says once why it leaves it out, and works as an older worker."""
    master.older_heartbeats = True
    values = [p.value for p in publisher.papers(2)]
    project = fleet.project()
    fleet.enqueue(project, values)
    worker = fleet.worker(project)
    counts = fleet.wait_settled(project, len(values), timeout=120, proc=worker)
    assert counts["done"] == len(values), worker.output()[-4000:]
    assert master.heartbeats_with_projects == 1
    assert worker.output().count("the master does not take a heartbeat's projects") == 1
    assert "first heartbeat failed" not in worker.output()
    assert worker.terminate() == 0
