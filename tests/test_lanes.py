"""Lanes on one queue (app.fleet.lanes): first-choice and fallback tiers, the
master-wide remote switch, and claim answers that never reached their worker.

In-process with the Flask test client and real PostgreSQL; the closed
connection is a raw socket against a real gunicorn master."""
from __future__ import annotations

import json
import socket
import time

import requests

from app.fleet.lanes import FIRST_FREE_CACHE_S
from tests.conftest import unique
from tests.fleet_helpers import Node
from tests.gunicorn_master import Gunicorn
from tests.helpers import VERSION, Api, api_error, body, sql, values, wait_for


def _tier(app, node: Node, tier: str) -> None:
    runner = app.test_cli_runner()
    out = runner.invoke(args=["fleet", "set-tier", node.node_id, tier])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["tier"] == tier


def _project(api, **policy) -> str:
    project = unique("lane")
    assert api.put_project(project, **policy)["fallback_after_seconds"] == policy.get(
        "fallback_after_seconds", 60)
    return project


def _claimed(response) -> list[dict]:
    assert response.status_code == 200, body(response)
    return body(response)["jobs"]


# ------------------------------------------------------------------- tiers

def test_fallback_worker_gets_a_job_only_after_it_waited_while_a_first_choice_worker_is_free(
        app, client, api):
    project = _project(api, fallback_after_seconds=3)
    first, fallback = Node(client, app, name="first"), Node(client, app, name="fallback")
    _tier(app, fallback, "fallback")
    assert first.heartbeat(capacity=2).status_code == 200  # fresh, two free slots
    assert api.enqueue(project, values(1)).status_code in (200, 201)

    assert _claimed(fallback.claim(project)) == []  # a fresh job: first choice's
    # A long poll is answered once the job has waited fallback_after_seconds,
    # without any notification.
    jobs = _claimed(fallback.claim(project, wait_ms=15_000))
    assert len(jobs) == 1
    (waited,) = sql(app, "SELECT extract(epoch FROM a.created_at - j.created_at) FROM attempts a "
                         "JOIN jobs j ON j.id = a.job_id WHERE a.id = :a",
                    a=int(jobs[0]["attempt_id"]))[0]
    assert float(waited) >= 3.0


def test_a_fallback_worker_waits_only_for_first_choice_workers_that_serve_the_project(
        app, client, api):
    """A fresh first-choice worker that serves other projects (the demo
    fetcher beside an OCR project) holds nothing back; one that says it
    serves this project does; one that says nothing counts for every project."""
    project = _project(api, fallback_after_seconds=600)
    first, fallback = Node(client, app, name="first"), Node(client, app, name="fallback")
    _tier(app, fallback, "fallback")
    assert first.heartbeat(capacity=2, projects=["papers", "other"]).status_code == 200
    assert api.enqueue(project, values(3)).status_code in (200, 201)
    assert len(_claimed(fallback.claim(project))) == 1  # at once: nobody first serves it
    assert first.heartbeat(capacity=2, projects=[project]).status_code == 200
    time.sleep(1.1)  # the first-choice answer is cached for a second
    assert _claimed(fallback.claim(project)) == []
    assert first.heartbeat(capacity=2).status_code == 200  # an older worker: says nothing
    time.sleep(1.1)
    assert _claimed(fallback.claim(project)) == []
    assert sql(app, "SELECT projects FROM fleet_nodes WHERE id = :n", n=first.node_id) == [(None,)]


def test_a_first_choice_worker_is_never_held_back(app, client, api):
    project = _project(api, fallback_after_seconds=86400)
    first = Node(client, app)
    first.heartbeat(capacity=2)
    api.enqueue(project, values(2))
    assert len(_claimed(first.claim(project, max_jobs=2))) == 2


def test_fallback_worker_takes_fresh_jobs_when_every_first_choice_slot_is_taken(app, client, api):
    project = _project(api, fallback_after_seconds=86400)
    first, fallback = Node(client, app), Node(client, app)
    _tier(app, fallback, "fallback")
    first.heartbeat(capacity=1)
    api.enqueue(project, values(2))
    assert len(_claimed(first.claim(project))) == 1  # its one slot is now busy
    assert len(_claimed(fallback.claim(project))) == 1


def test_a_staged_upload_keeps_its_first_choice_slot_taken(app, client, api):
    """A staged job (its upload waiting for the archive) holds its worker's
    slot, as the in-flight caps count it: the fallback worker may go on."""
    project = _project(api, fallback_after_seconds=86400)
    first, fallback = Node(client, app), Node(client, app)
    _tier(app, fallback, "fallback")
    first.heartbeat(capacity=1)
    api.enqueue(project, values(2))
    [job] = _claimed(first.claim(project))
    sql(app, "UPDATE jobs SET state = 'staged', lease_expires_at = NULL WHERE id = :j",
        j=job["job_id"])
    assert len(_claimed(fallback.claim(project))) == 1


def test_project_max_worker_in_flight_bounds_a_first_choice_workers_free_slots(app, client, api):
    project = _project(api, fallback_after_seconds=86400, max_worker_in_flight=1)
    first, fallback = Node(client, app), Node(client, app)
    _tier(app, fallback, "fallback")
    first.heartbeat(capacity=8)  # eight slots, but one job of this project at a time
    api.enqueue(project, values(2))
    assert len(_claimed(first.claim(project, max_jobs=2))) == 1
    assert len(_claimed(fallback.claim(project))) == 1


def test_fallback_worker_takes_fresh_jobs_when_no_first_choice_worker_has_a_fresh_heartbeat(
        app, client, api):
    project = _project(api, fallback_after_seconds=86400)
    first, fallback = Node(client, app), Node(client, app)
    _tier(app, fallback, "fallback")
    first.heartbeat(capacity=2)
    stale_s = app.config["WORKER_STALE_S"]
    sql(app, "UPDATE fleet_nodes SET last_heartbeat_at = now() - make_interval(secs => :s) "
             "WHERE id = :n", s=stale_s + 1, n=first.node_id)
    api.enqueue(project, values(1))
    assert len(_claimed(fallback.claim(project))) == 1


def _token_heartbeat(api, worker_id: str, capacity: int) -> None:
    response = api.call("POST", "/api/v1/fleet/heartbeat", {
        "worker_id": worker_id, "capacity": capacity, "browser_ok": True, "disk_free_bytes": 1,
        "spool_bytes": 0, "running_attempt_ids": []})
    assert response.status_code == 200, body(response)


def test_token_workers_have_tiers_too(app, api):
    project = _project(api, fallback_after_seconds=86400)
    _token_heartbeat(api, "tw-fallback", 1)  # recorded, first choice by default
    runner = app.test_cli_runner()
    out = runner.invoke(args=["fleet", "set-tier", "tw-fallback", "fallback", "--user", "admin"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"worker_id": "tw-fallback", "user_id": "admin",
                                      "status": "active", "tier": "fallback"}
    # A first-choice token worker with a fresh heartbeat and a free slot holds it back.
    _token_heartbeat(api, "tw-first", 1)
    api.enqueue(project, values(1))
    assert _claimed(api.claim(project, worker_id="tw-fallback", max_jobs=1)) == []
    assert len(_claimed(api.claim(project, worker_id="tw-first", max_jobs=1))) == 1


def test_set_tier_refuses_unknown_workers_and_tiers(app):
    runner = app.test_cli_runner()
    out = runner.invoke(args=["fleet", "set-tier", "no-such-node-000000", "fallback"])
    assert out.exit_code == 1 and "not_found" in out.output
    out = runner.invoke(args=["fleet", "set-tier", "no-such-node-000000", "second"])
    assert out.exit_code == 2 and "second" in out.output


def test_put_project_cli_sets_fallback_after_seconds(app, api):
    project = unique("lanecli")
    runner = app.test_cli_runner()
    out = runner.invoke(args=["fleet", "put-project", project, "--fallback-after-seconds", "5"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["fallback_after_seconds"] == 5
    out = runner.invoke(args=["fleet", "put-project", project, "--patch",
                              "--fallback-after-seconds", "86401"])
    assert out.exit_code == 1 and "fallback_after_seconds" in out.output


def test_the_savewebhq_contract_does_not_carry_fallback_after_seconds(api):
    project = _project(api, fallback_after_seconds=7)
    summary = body(api.call("GET", f"/api/v1/admin/projects/{project}"))
    assert "fallback_after_seconds" not in summary
    response = api.call("PUT", f"/api/v1/admin/projects/{project}", {
        "status": "active", "dispatch_qps": None, "worker_claim_qps": None,
        "max_jobs_per_claim": 10, "client_versions": [VERSION], "fallback_after_seconds": 1})
    assert api_error(response, 400, "invalid_request")["details"]["field"] == "fallback_after_seconds"


# ---------------------------------------------------------- remote switch

def _local_node(app, client) -> Node:
    node = Node(client, app, name="local")
    sql(app, "UPDATE fleet_nodes SET local = true WHERE id = :n", n=node.node_id)
    return node


def test_remote_off_stops_every_remote_claim_and_keeps_the_local_lane(app, client, api):
    project = _project(api)
    remote, local = Node(client, app, name="remote"), _local_node(app, client)
    api.enqueue(project, values(4))
    held = _claimed(remote.claim(project))
    assert len(held) == 1

    runner = app.test_cli_runner()
    out = runner.invoke(args=["fleet", "remote", "off"])
    assert out.exit_code == 0 and json.loads(out.output)["remote"] == "off"
    assert json.loads(runner.invoke(args=["fleet", "remote", "status"]).output) == {"remote": "off"}
    answer = remote.claim(project)
    assert answer.status_code == 200 and body(answer)["jobs"] == []
    assert body(answer)["retry_after_ms"] > 0
    assert _claimed(api.claim(project, worker_id="token-remote")) == []  # token workers too
    # What a remote worker holds it may still finish.
    done = remote._call("POST", f"/api/v1/projects/{project}/jobs/complete", json={
        "worker_id": remote.node_id, "items": [{"job_id": held[0]["job_id"],
                                                "attempt_id": held[0]["attempt_id"],
                                                "outcome": {"kind": "success"}}]})
    assert body(done)["results"][0]["status"] == "applied"
    assert len(_claimed(local.claim(project))) == 1  # the local lane keeps working

    assert json.loads(runner.invoke(args=["fleet", "remote", "on"]).output)["remote"] == "on"
    assert len(_claimed(remote.claim(project))) == 1


def test_turning_remote_on_wakes_a_waiting_remote_long_poll(app, live_server, admin_token):
    api = Api(requests.Session(), admin_token, base=live_server.url)
    project = _project(api)
    api.enqueue(project, values(1))
    runner = app.test_cli_runner()
    runner.invoke(args=["fleet", "remote", "off"])
    import threading
    result = {}

    def poll():
        started = time.monotonic()
        result["jobs"] = body(api.claim(project, worker_id="waiting-remote", wait_ms=20_000))["jobs"]
        result["elapsed"] = time.monotonic() - started
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(0.5)  # let it start waiting (the claim must not be answered before the switch)
    assert thread.is_alive()
    runner.invoke(args=["fleet", "remote", "on"])
    thread.join(25)
    assert len(result["jobs"]) == 1
    assert result["elapsed"] < 15  # woken by the switch, not by the end of its wait


# ----------------------------------------------- a claim nobody receives

def test_release_undelivered_gives_the_job_back_without_a_reset(app, client, api):
    from app.extensions import db
    from app.projects import leasing
    project = _project(api)
    api.enqueue(project, values(1))
    (job,) = _claimed(api.claim(project, worker_id="gone"))
    with app.app_context():
        assert leasing.release_undelivered([int(job["attempt_id"])]) == 1
        assert leasing.release_undelivered([int(job["attempt_id"])]) == 0  # once only
        db.session.remove()
    row = sql(app, "SELECT state, resets, attempts_count, lease_expires_at FROM jobs WHERE id = :j",
              j=job["job_id"])[0]
    assert tuple(row) == ("todo", 0, 0, None)
    attempt = sql(app, "SELECT state, error->>'code' FROM attempts WHERE id = :a",
                  a=int(job["attempt_id"]))[0]
    assert tuple(attempt) == ("cancelled", "claim_undelivered")
    assert len(_claimed(api.claim(project, worker_id="other"))) == 1


def _raw_long_poll(url: str, token: str, project: str, worker_id: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps({"worker_id": worker_id, "max_jobs": 2, "lease_seconds": 120,
                          "wait_ms": 25_000}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"POST /api/v1/projects/{project}/jobs/claim HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\nX-Client-Version: {VERSION}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload)
    return sock


def test_a_worker_gone_during_its_long_poll_costs_no_lease_and_no_reset(
        app, database_url, admin_token, tmp_path):
    server = Gunicorn({"DATABASE_URL": database_url}, tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        api = Api(requests.Session(), admin_token, base=server.url)
        # Paced, so that every claim answer is counted (worker_claim_buckets):
        # the test knows when the dead worker's poll has been answered.
        project = _project(api, worker_claim_qps=100.0)
        sock = _raw_long_poll(server.url, admin_token, project, "killed-worker")
        # The claim is waiting (its token worker is recorded), then the worker dies.
        wait_for(lambda: sql(app, "SELECT 1 FROM token_workers WHERE worker_id = 'killed-worker'"),
                 20, "the long poll to reach the master")
        sock.close()
        assert api.enqueue(project, values(2)).status_code in (200, 201)  # wakes the poll
        answered = wait_for(lambda: sql(
            app, "SELECT jobs_dispatched FROM worker_claim_buckets WHERE worker_id = 'killed-worker'"),
            20, "the dead worker's long poll to be answered")
        assert answered[0][0] == 0
        got: list[dict] = []

        def both_claimed():
            got.extend(_claimed(api.claim(project, worker_id="alive", max_jobs=2)))
            return len(got) == 2
        # Claimable at once by another worker: no lease held for a dead client.
        wait_for(both_claimed, 10, "both jobs to be claimable by another worker")
        rows = sql(app, "SELECT resets, attempts_count FROM jobs WHERE project_id = :p", p=project)
        assert sorted(tuple(r) for r in rows) == [(0, 1), (0, 1)]
        assert not sql(app, "SELECT 1 FROM attempts WHERE worker_id = 'killed-worker' "
                            "AND state = 'running'")
    finally:
        server.stop()


def test_remote_jobs_snapshot_shows_the_queue_the_local_lane_takes_from(app, client, api, make_user):
    """The jobs table is the local lane's admission journal: a queued job is a
    durable ``todo`` row, listed by the snapshot up to its bound like any other."""
    project = _project(api)
    local = _local_node(app, client)
    api.enqueue(project, values(6))
    app.test_cli_runner().invoke(args=["fleet", "remote", "off"])  # only the local lane claims
    (taken,) = _claimed(local.claim(project))
    reader = Api(client, make_user("rita", ["reader"]), version=None)
    rows = body(reader.call("GET", f"/api/v1/remote-jobs?project={project}"))["jobs"]
    states = {r["id"]: (r["state"], r["worker_id"]) for r in rows}
    assert states == {**{f"v{i}": ("queued", None) for i in range(6)},
                      taken["id"]: ("running", local.node_id)}
    bounded = body(reader.call("GET", f"/api/v1/remote-jobs?project={project}&limit=4"))["jobs"]
    assert len(bounded) == 4 and all(r["state"] == "queued" for r in bounded)  # newest first


# -------------------------------------------------------------- lane order

def test_a_pdf_project_is_local_first_for_new_workers_without_hand_work(app, client, api):
    project = _project(api, kind="pdf", fallback_after_seconds=86400)
    assert api.call("GET", f"/api/v1/fleethq/projects/{project}").json["lane_order"] == "local_first"
    remote, local = Node(client, app, name="remote"), _local_node(app, client)
    assert sql(app, "SELECT tier FROM fleet_nodes WHERE id IN (:r, :l)",
               r=remote.node_id, l=local.node_id) == [("auto",), ("auto",)]
    for node in (remote, local):
        assert node.heartbeat(capacity=1, projects=[project]).status_code == 200
    api.enqueue(project, [{"id": "a", "value": "https://example.org/a.pdf"},
                          {"id": "b", "value": "https://example.org/b.pdf"}])
    # The local fetcher has a free slot: the fresh jobs are its own.
    assert _claimed(remote.claim(project)) == []
    assert len(_claimed(local.claim(project))) == 1
    # Its one slot is taken: the remote node takes what it cannot (once the
    # claimers' cached answer to "is a first-choice worker free?" is renewed).
    time.sleep(FIRST_FREE_CACHE_S)
    assert len(_claimed(remote.claim(project))) == 1


def test_documents_and_generic_projects_are_remote_first_and_the_local_lane_their_fallback(
        app, client, api):
    scans = _project(api, kind="documents")
    assert api.call("GET", f"/api/v1/fleethq/projects/{scans}").json["lane_order"] == "remote_first"
    project = _project(api, fallback_after_seconds=86400)    # generic: takes plain jobs
    assert api.call("GET", f"/api/v1/fleethq/projects/{project}").json["lane_order"] == "remote_first"
    remote, local = Node(client, app, name="ocr-host"), _local_node(app, client)
    for node in (remote, local):
        assert node.heartbeat(capacity=1, projects=[project]).status_code == 200
    response = api.enqueue(project, [{"id": "a", "value": "a"}, {"id": "b", "value": "b"}])
    assert response.status_code == 200, body(response)
    assert _claimed(local.claim(project)) == []        # the strong host is free
    assert len(_claimed(remote.claim(project))) == 1
    time.sleep(FIRST_FREE_CACHE_S)
    assert len(_claimed(local.claim(project))) == 1   # its slot is taken: the local lane helps


def test_lane_order_is_a_project_setting_and_a_pinned_tier_holds_in_every_project(app, client, api):
    project = _project(api, kind="pdf", fallback_after_seconds=86400)
    remote, local = Node(client, app, name="remote"), _local_node(app, client)
    for node in (remote, local):
        assert node.heartbeat(capacity=1, projects=[project]).status_code == 200
    api.enqueue(project, [{"id": str(n), "value": f"https://example.org/{n}.pdf"} for n in range(3)])
    assert _claimed(remote.claim(project)) == []
    response = api.call("PATCH", f"/api/v1/fleethq/projects/{project}", {"lane_order": "remote_first"})
    assert response.status_code == 200 and response.json["lane_order"] == "remote_first"
    assert len(_claimed(remote.claim(project))) == 1   # now the remote node comes first
    # A tier set by hand wins over the lane order.
    _tier(app, remote, "fallback")
    _tier(app, local, "first")                         # (set_tier renews the cached answer)
    assert _claimed(remote.claim(project)) == []
    assert len(_claimed(local.claim(project))) == 1
    response = api.call("PATCH", f"/api/v1/fleethq/projects/{project}", {"lane_order": "sideways"})
    assert api_error(response, 400, "invalid_request")["details"]["field"] == "lane_order"

