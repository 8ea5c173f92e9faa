"""fleethq-worker end to end: a real master (werkzeug server, PostgreSQL, a
real Dramatiq worker on Redis archiving into a local store), the local test
publisher, and the worker as a subprocess.

Happy path over every HTTP way of serving a paper (and the browser lane),
failure reports with their codes, and the node lifecycle (pending, approved).
"""
from __future__ import annotations

import time

from tests.worker_harness import (archiver, fleet, master, publisher, sql,  # noqa: F401
                                       wait_for)


def test_pending_worker_waits_then_archives_every_paper_and_deletes_its_files(fleet, publisher):
    url = publisher.url
    values = [f"{url}/papers/1.pdf", f"{url}/papers/2.pdf", f"{url}/attachment/3",
              f"{url}/landing/4", f"{url}/links/5", f"{url}/chain/3/6", f"{url}/cookie/7",
              "10.5555/landing/8",                  # a DOI, through the publisher's resolver
              f"{url}/jslink/9"]                    # only a browser finds this link
    project = fleet.project()
    fleet.enqueue(project, values)
    worker = fleet.worker(project, approve=False, FLEETHQ_DOI_RESOLVER=f"{url}/doi/")

    # Registered but pending: it waits, polling its status, and claims nothing.
    wait_for(lambda: "waiting for an admin to approve" in worker.output(), 30, "the pending message")
    time.sleep(2)
    assert fleet.counts(project)["todo"] == len(values)
    node_id = fleet.approve(worker)

    counts = fleet.wait_settled(project, len(values), timeout=120, proc=worker)
    assert counts["done"] == len(values), (counts, worker.output()[-4000:])
    fleet.archived_once(project)
    wait_for(lambda: worker.files() == [], 15, f"files to leave the volume: {worker.files()}")
    wait_for(lambda: worker.states() == {"done": len(values)}, 15, f"journal: {worker.states()}")

    strategies = {r["value"]: r["download_strategy"] for r in sql(
        fleet.app, "SELECT j.value, u.download_strategy FROM uploads u JOIN jobs j ON j.id = u.job_id "
                   "WHERE u.project_id = :p", p=project)}
    assert strategies[f"{url}/papers/1.pdf"] == "direct"
    assert strategies[f"{url}/landing/4"] == "landing"
    assert strategies[f"{url}/jslink/9"] == "browser"
    keys = {r["canonical_key"] for r in sql(fleet.app, "SELECT canonical_key FROM assets")}
    assert "doi:10.5555/landing/8" in keys
    node = sql(fleet.app, "SELECT status, capacity, browser_ok, spool_bytes FROM fleet_nodes "
                          "WHERE id = :n", n=node_id)[0]
    assert node["status"] == "active" and node["capacity"] == 2 and node["browser_ok"] is True

    assert worker.terminate() == 0  # SIGTERM: a clean stop
    assert "stopped; 0 ready file(s)" in worker.output()


def test_failures_are_reported_with_their_codes(fleet, publisher):
    """(A site pushing back, challenge or throttled, pauses the site and keeps
    the job: tests/test_site_politeness_e2e.py.)"""
    url = publisher.url
    cases = {f"{url}/missing/1": ("failed", "not_found"),
             f"{url}/fakepdf/2": ("failed", "invalid_pdf"),
             f"{url}/truncated/3": ("failed", "invalid_pdf"),
             f"{url}/paywall403/4": ("reset_exhausted", "paywall"),   # retryable: another network may pass
             "https://10.0.0.1/paper.pdf": ("reset_exhausted", "network")}   # refused address
    project = fleet.project(max_resets=0)
    fleet.enqueue(project, list(cases))
    worker = fleet.worker(project, FLEETHQ_NO_BROWSER="1", FLEETHQ_FETCH_TIMEOUT="5")
    fleet.wait_settled(project, len(cases), timeout=120, proc=worker)
    rows = sql(fleet.app, "SELECT value, state, last_error->>'code' AS code FROM jobs "
                          "WHERE project_id = :p", p=project)
    assert {r["value"]: (r["state"], r["code"]) for r in rows} == cases
    # Every failure was reported once: nothing left to report, no file kept.
    wait_for(lambda: all(e.get("reported") for e in worker.journal().values()), 15, "reports")
    assert worker.files() == []
    node = sql(fleet.app, "SELECT browser_ok, last_error FROM fleet_nodes")[0]
    assert node["browser_ok"] is None           # --no-browser: no browser lane to fail
    assert worker.terminate() == 0


def test_a_lost_registration_answer_is_retried_with_the_same_identity(fleet, publisher, master):
    master.lose_register_answers = 2
    project = fleet.project()
    fleet.enqueue(project, [publisher.papers(1)[0].value])
    worker = fleet.worker(project, approve=False)
    first = wait_for(worker.identity, 30, "the identity file")
    node_id = fleet.approve(worker)          # registered after the retries
    assert node_id == first["worker_id"] and master.lose_register_answers == 0
    assert worker.output().count("retrying with the same identity") == 2
    assert fleet.wait_settled(project, 1, timeout=60, proc=worker)["done"] == 1
    assert worker.terminate() == 0


def test_a_worker_whose_version_is_not_allowed_says_what_is(fleet):
    """A 426 on claim: the worker's log and its node's last error name the
    version it sent and the ones the project allows, so the fix is plain."""
    project = fleet.project(client_versions=["fleethq-worker/9.9", "fleethq-worker/dev"])
    worker = fleet.worker(project, FLEETHQ_NO_BROWSER="1")
    line = wait_for(lambda: next((ln for ln in worker.output().splitlines()
                                  if f"claim from {project}: 426" in ln), None), 30, "a 426 claim")
    sent = worker.env["FLEETHQ_CLIENT_VERSION"]
    assert f"this worker sends {sent!r}" in line, line
    assert "the project allows: fleethq-worker/9.9, fleethq-worker/dev" in line, line
    node = wait_for(lambda: sql(fleet.app, "SELECT last_error FROM fleet_nodes WHERE last_error "
                                           "LIKE '%allows%'"), 30, "the node's last error")
    assert "fleethq-worker/9.9" in node[0]["last_error"]
    assert worker.terminate() == 0
