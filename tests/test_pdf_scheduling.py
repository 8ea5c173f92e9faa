"""Scheduling of pdf projects (DESIGN §5, §7, §12; issue 3): claims need a
fresh heartbeat, paper identifiers only, global and per-worker in-flight caps
(also under parallel claims over real HTTP), prefer_new_worker failover with
the lone-worker exception, the distinct-worker cap, completion only through
an upload, and attempt/task deadlines bounding every lease."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
import requests

from tests.fleet_helpers import Node, decide, papers, pdf_project
from tests.helpers import Api, api_error, body, sql


# ------------------------------------------------------------------ helpers


def error_code(response) -> str:
    return body(response)["error"]["code"]


def claimed(response, n: int | None = None) -> list[dict]:
    assert response.status_code == 200, body(response)
    jobs = body(response)["jobs"]
    if n is not None:
        assert len(jobs) == n, jobs
    return jobs


def enqueue(api: Api, project: str, jobs: list[dict]) -> dict:
    response = api.enqueue(project, jobs)
    assert response.status_code == 200, body(response)
    return body(response)


def item_results(response) -> list[dict]:
    assert response.status_code == 200, body(response)
    return body(response)["results"]


def age_heartbeat(app, node: Node, interval: str = "2 minutes") -> None:
    sql(app, f"UPDATE fleet_nodes SET last_heartbeat_at = now() - interval '{interval}' WHERE id = :i",
        i=node.node_id)


def live_node(client, app, **kw) -> Node:
    node = Node(client, app, **kw)
    response = node.heartbeat()
    assert response.status_code == 200, body(response)
    return node


def sweep(app) -> dict:
    from app.extensions import db
    from app.projects import leasing
    with app.app_context():
        out = leasing.sweep()
        db.session.remove()
    return out


def job_state(app, job_id: str):
    return sql(app, "SELECT state, last_error ->> 'code' FROM jobs WHERE id = :j", j=int(job_id))[0]


def extend(node: Node, project: str, jobs, seconds: int):
    return node._call("POST", f"/api/v1/projects/{project}/jobs/extend-lease", json={
        "worker_id": node.node_id, "extend_seconds": seconds,
        "items": [{"job_id": j["job_id"], "attempt_id": j["attempt_id"]} for j in jobs]})


# ------------------------------------------------------- fresh heartbeats

def test_claims_need_a_fresh_heartbeat(app, client, api):
    pdf_project(api, "papers")
    enqueue(api, "papers", papers(4))
    node = Node(client, app)

    response = node.claim("papers")
    assert response.status_code == 409, body(response)
    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == 0

    assert node.heartbeat().status_code == 200
    claimed(node.claim("papers"), 1)

    # A heartbeat older than one node lease (60 s) no longer counts.
    age_heartbeat(app, node, "61 seconds")
    response = node.claim("papers")
    assert response.status_code == 409, body(response)
    age_heartbeat(app, node, "30 seconds")
    claimed(node.claim("papers"), 1)

    # A long-poll does not get around the gate either.
    age_heartbeat(app, node, "5 minutes")
    assert node.claim("papers", wait_ms=100).status_code == 409
    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == 2


def test_token_workers_need_a_fresh_heartbeat_of_their_own_worker_id(app, client, api, make_user):
    pdf_project(api, "papers")
    enqueue(api, "papers", papers(3))
    dave = Api(client, make_user("dave", ["worker"]))
    suffix = uuid.uuid4().hex[:6]
    wa, wb = f"dave-a-{suffix}", f"dave-b-{suffix}"
    assert dave.claim("papers", worker_id=wa, max_jobs=1).status_code == 409
    beat = dave.call("POST", "/api/v1/fleet/heartbeat", {
        "worker_id": wa, "capacity": 1, "browser_ok": True, "disk_free_bytes": 1, "spool_bytes": 0,
        "running_attempt_ids": []})
    assert beat.status_code == 200, body(beat)
    claimed(dave.claim("papers", worker_id=wa, max_jobs=1), 1)
    # The heartbeat of one worker id does not license another.
    assert dave.claim("papers", worker_id=wb, max_jobs=1).status_code == 409


def test_generic_projects_need_no_heartbeat(app, client, api):
    api.put_project("gen")
    api.enqueue("gen", [{"id": "a", "value": "anything"}])
    node = Node(client, app)
    claimed(node.claim("gen"), 1)


# ----------------------------------------------------------------- enqueue

@pytest.mark.parametrize("bad", [
    "hello world", "ftp://example.org/a.pdf", "javascript:alert(1)", "file:///etc/passwd",
    "mailto:someone@example.org", "10.12/x", "https://user:pw@example.org/a.pdf",
    "https://exa mple.org/x",
])
def test_enqueue_accepts_only_paper_identifiers(app, api, bad):
    pdf_project(api, "papers")
    response = api.enqueue("papers", [{"value": "10.1234/fine"}, {"value": "arXiv:2101.00001"},
                                      {"value": bad}])
    assert response.status_code == 400, body(response)
    assert error_code(response) == "invalid_job"
    assert body(response)["error"]["details"]["index"] == 2
    assert sql(app, "SELECT count(*) FROM jobs")[0][0] == 0


def test_enqueue_takes_dois_arxiv_ids_and_http_urls(app, api):
    pdf_project(api, "papers")
    out = enqueue(api, "papers", [
        {"value": "10.1234/abc"}, {"value": "doi:10.5555/XYZ"}, {"value": "arXiv:2101.00001"},
        {"value": "hep-th/9901001"}, {"value": "https://example.org/paper.pdf"},
        {"value": "http://example.org/landing?id=1"}])
    assert out["submitted"] == 6 and out["inserted"] == 6
    # No task deadline yet: it starts at the first claim (DESIGN §12: 15 min from then).
    assert sql(app, "SELECT count(*) FROM jobs WHERE deadline_at IS NULL") == [(6,)]


# -------------------------------------------------------------------- caps

def test_per_worker_and_global_caps_across_nodes(app, client, api):
    project = pdf_project(api, "papers")
    assert project["max_in_flight"] == 6 and project["max_worker_in_flight"] == 2
    enqueue(api, "papers", papers(20))
    a, b, c, d = (live_node(client, app, name=n) for n in "abcd")

    assert len(claimed(a.claim("papers", max_jobs=5), 2)) == 2
    assert claimed(a.claim("papers", max_jobs=5), 0) == []
    b_jobs = claimed(b.claim("papers", max_jobs=5), 2)
    c_jobs = claimed(c.claim("papers", max_jobs=1), 1)
    assert len(claimed(c.claim("papers", max_jobs=5), 1)) == 1
    assert claimed(d.claim("papers", max_jobs=5), 0) == []   # 6 in flight
    assert sql(app, "SELECT count(*) FROM attempts WHERE state = 'running'")[0][0] == 6

    # A finished attempt frees a slot.
    item_results(b.fail("papers", b_jobs[0], retryable=False))
    assert len(claimed(d.claim("papers", max_jobs=5), 1)) == 1
    assert claimed(d.claim("papers", max_jobs=5), 0) == []

    # An expired lease counts against no cap.
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :j",
        j=int(c_jobs[0]["job_id"]))
    assert len(claimed(d.claim("papers", max_jobs=5), 1)) == 1
    live = sql(app, "SELECT worker_id, count(*) FROM jobs WHERE state = 'wip' "
                    "AND lease_expires_at > now() GROUP BY worker_id")
    assert sum(n for _, n in live) == 6
    assert all(n <= 2 for _, n in live)


def test_an_archived_paper_wakes_a_claim_waiting_for_a_free_slot(app, client, api):
    """A long poll held back only by the in-flight caps goes on as soon as
    a job of the project is archived, not at the end of its wait."""
    pdf_project(api, "papers", max_worker_in_flight=1)
    enqueue(api, "papers", papers(3))
    node = live_node(client, app)
    [job] = claimed(node.claim("papers", max_jobs=1), 1)
    sql(app, "UPDATE jobs SET state = 'staged' WHERE id = :j", j=job["job_id"])
    sql(app, "UPDATE attempts SET state = 'staged' WHERE id = :a", a=int(job["attempt_id"]))
    sql(app, "INSERT INTO uploads (attempt_id, job_id, project_id, worker_id, state, sha256, size) "
             "VALUES (:a, :j, 'papers', :w, 'staged', repeat('0', 64), 1)",
        a=int(job["attempt_id"]), j=job["job_id"], w=node.node_id)
    answer = {}

    def waiting_claim():
        began = time.monotonic()
        answer["jobs"] = claimed(node.claim("papers", max_jobs=1, wait_ms=20_000))
        answer["seconds"] = time.monotonic() - began

    waiter = threading.Thread(target=waiting_claim)
    waiter.start()
    time.sleep(0.5)  # the claim is asleep: its one slot is taken
    assert waiter.is_alive()
    from app.extensions import db
    from app.uploads import transitions
    with app.app_context():
        assert transitions.complete(int(job["attempt_id"]), "sha256/archived.pdf")
        db.session.remove()
    waiter.join(20)
    assert len(answer["jobs"]) == 1 and answer["seconds"] < 10


def test_parallel_claims_respect_both_caps(app, live_server, admin_token):
    session = requests.Session()
    api = Api(session, admin_token, base=live_server.url)
    pdf_project(api, "papers")
    enqueue(api, "papers", papers(30))
    nodes = []
    for i in range(4):
        node = Node(requests.Session(), app, base=live_server.url, name=f"n{i}")
        assert node.heartbeat().status_code == 200
        nodes.append(node)

    per_node = 3
    barrier = threading.Barrier(len(nodes) * per_node)
    got: dict[str, list] = {n.node_id: [] for n in nodes}
    errors: list = []
    lock = threading.Lock()

    def run(node: Node):
        try:
            barrier.wait(timeout=30)
            response = requests.post(
                f"{live_server.url}/api/v1/projects/papers/jobs/claim", headers=node.headers,
                json={"worker_id": node.node_id, "max_jobs": 2, "lease_seconds": 60}, timeout=60)
            with lock:
                if response.status_code == 200:
                    got[node.node_id].extend(response.json()["jobs"])
                else:
                    errors.append((response.status_code, response.text))
        except Exception as exc:  # surfaced below
            with lock:
                errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(n,)) for n in nodes for _ in range(per_node)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not errors, errors
    counts = {nid: len(jobs) for nid, jobs in got.items()}
    assert all(n <= 2 for n in counts.values()), counts
    assert sum(counts.values()) == 6, counts
    all_ids = [j["job_id"] for jobs in got.values() for j in jobs]
    assert len(set(all_ids)) == len(all_ids)
    live = sql(app, "SELECT worker_id, count(*) FROM attempts WHERE state = 'running' GROUP BY worker_id")
    assert sum(n for _, n in live) == 6 and all(n <= 2 for _, n in live), live


# ---------------------------------------------------------------- failover

def test_retry_goes_to_a_worker_that_has_not_tried(app, client, api):
    pdf_project(api, "papers", retry_backoff_seconds=0)
    enqueue(api, "papers", papers(1))
    a, b = live_node(client, app, name="a"), live_node(client, app, name="b")
    [job] = claimed(a.claim("papers"), 1)
    [result] = item_results(a.fail("papers", job, retryable=True, code="paywall"))
    assert result["status"] == "applied" and result["job_status"] == "todo"

    assert claimed(a.claim("papers"), 0) == []   # A already tried; B has not
    [retry] = claimed(b.claim("papers"), 1)
    assert retry["job_id"] == job["job_id"]
    assert retry["attempt_id"] != job["attempt_id"]
    history = sql(app, "SELECT worker_id, state FROM attempts WHERE job_id = :j ORDER BY id",
                  j=int(job["job_id"]))
    assert history == [(a.node_id, "failed"), (b.node_id, "running")]


def test_the_preference_for_a_new_worker_ends_once_the_retry_has_waited(app, client, api):
    """B is fresh but never takes the job (it serves other work): after the
    preference's wait, A, which tried it, may take it again."""
    from app.projects.leasing import PREFER_NEW_WAIT_S
    pdf_project(api, "papers", retry_backoff_seconds=0)
    enqueue(api, "papers", papers(1))
    a, _b = live_node(client, app, name="a"), live_node(client, app, name="b")
    [job] = claimed(a.claim("papers"), 1)
    item_results(a.fail("papers", job, retryable=True, code="network"))
    assert claimed(a.claim("papers"), 0) == []
    sql(app, "UPDATE jobs SET not_before = now() - make_interval(secs => :s) WHERE id = :j",
        s=PREFER_NEW_WAIT_S + 1, j=int(job["job_id"]))
    [retry] = claimed(a.claim("papers"), 1)
    assert retry["job_id"] == job["job_id"] and retry["attempt_id"] != job["attempt_id"]


def test_a_retry_is_not_held_back_for_a_worker_that_serves_other_projects(app, client, api):
    """B is fresh but its heartbeat says it serves only another project (a
    fetch node beside an OCR node): A, which tried the job, retries at once."""
    pdf_project(api, "papers", retry_backoff_seconds=0)
    enqueue(api, "papers", papers(1))
    a, b = live_node(client, app, name="a"), live_node(client, app, name="b")
    assert b.heartbeat(projects=["other"]).status_code == 200
    [job] = claimed(a.claim("papers"), 1)
    item_results(a.fail("papers", job, retryable=True, code="network"))
    [retry] = claimed(a.claim("papers"), 1)
    assert retry["job_id"] == job["job_id"] and retry["attempt_id"] != job["attempt_id"]
    # Once B says it serves this project too, the preference holds again.
    item_results(a.fail("papers", retry, retryable=True, code="network"))
    assert b.heartbeat(projects=["other", "papers"]).status_code == 200
    assert claimed(a.claim("papers"), 0) == []


@pytest.mark.parametrize("how_b_is_gone", ["heartbeat aged out", "draining", "revoked", "pending"])
def test_a_lone_worker_may_retry_its_own_failure(app, client, api, how_b_is_gone):
    pdf_project(api, "papers", retry_backoff_seconds=0)
    enqueue(api, "papers", papers(1))
    a = live_node(client, app, name="a")
    b = live_node(client, app, name="b", approve=how_b_is_gone != "pending")
    [job] = claimed(a.claim("papers"), 1)
    item_results(a.fail("papers", job, retryable=True))
    if how_b_is_gone == "heartbeat aged out":
        age_heartbeat(app, b)
    elif how_b_is_gone in ("draining", "revoked"):
        decide(app, b.node_id, "drain" if how_b_is_gone == "draining" else "revoke")
    [retry] = claimed(a.claim("papers"), 1)
    assert retry["job_id"] == job["job_id"]


def test_without_prefer_new_worker_the_same_worker_retries(app, client, api):
    pdf_project(api, "papers", retry_backoff_seconds=0, prefer_new_worker=False)
    enqueue(api, "papers", papers(1))
    a, _b = live_node(client, app, name="a"), live_node(client, app, name="b")
    [job] = claimed(a.claim("papers"), 1)
    item_results(a.fail("papers", job, retryable=True))
    [retry] = claimed(a.claim("papers"), 1)
    assert retry["job_id"] == job["job_id"]


def test_pdf_retries_wait_for_the_default_backoff(app, client, api):
    project = pdf_project(api, "papers")
    assert project["retry_backoff_seconds"] == 30 and project["prefer_new_worker"] is True
    enqueue(api, "papers", papers(1))
    a, b = live_node(client, app, name="a"), live_node(client, app, name="b")
    [job] = claimed(a.claim("papers"), 1)
    item_results(a.fail("papers", job, retryable=True))
    assert claimed(b.claim("papers"), 0) == []
    wait = sql(app, "SELECT extract(epoch FROM not_before - now()) FROM jobs WHERE id = :j",
               j=int(job["job_id"]))[0][0]
    assert 10 <= float(wait) <= 31, wait   # 30 s base with equal jitter (50..100 %)


# ------------------------------------------------------ distinct workers cap

def _fail_by_each(app, api, nodes, job_id):
    for node in nodes:
        [attempt] = claimed(node.claim("papers"), 1)
        assert attempt["job_id"] == job_id
        [r] = item_results(node.fail("papers", attempt, retryable=True))
        assert r["status"] == "applied" and r["job_status"] == "todo", r


def test_sweep_fails_a_job_tried_by_three_distinct_workers(app, client, api):
    pdf_project(api, "papers", retry_backoff_seconds=0, max_resets=20)
    enqueue(api, "papers", papers(1))
    [job_id] = [r[0] for r in sql(app, "SELECT id FROM jobs")]
    a, b, c = (live_node(client, app, name=n) for n in "abc")
    _fail_by_each(app, api, [a, b, c], job_id)
    assert job_state(app, job_id)[0] == "todo"

    out = sweep(app)
    assert out["tried_out"] == 1, out
    assert job_state(app, job_id) == ("failed", "no_eligible_worker")
    d = live_node(client, app, name="d")
    assert claimed(d.claim("papers"), 0) == []


def test_sweep_counts_distinct_workers_not_attempts(app, client, api):
    pdf_project(api, "papers", retry_backoff_seconds=0, max_resets=20)
    enqueue(api, "papers", papers(1))
    [job_id] = [r[0] for r in sql(app, "SELECT id FROM jobs")]
    a, b = live_node(client, app, name="a"), live_node(client, app, name="b")
    _fail_by_each(app, api, [a, b, a, b], job_id)   # 4 attempts, 2 workers
    assert sql(app, "SELECT count(*) FROM attempts")[0][0] == 4
    assert sweep(app)["tried_out"] == 0
    assert job_state(app, job_id)[0] == "todo"


def test_a_fourth_distinct_worker_never_gets_the_job(app, client, api):
    """DESIGN §12: at most 3 distinct workers per pdf job — the cap holds at
    claim time, not only once the periodic sweep has run."""
    pdf_project(api, "papers", retry_backoff_seconds=0, max_resets=20)
    enqueue(api, "papers", papers(1))
    [job_id] = [r[0] for r in sql(app, "SELECT id FROM jobs")]
    a, b, c, d = (live_node(client, app, name=n) for n in "abcd")
    _fail_by_each(app, api, [a, b, c], job_id)
    assert claimed(d.claim("papers"), 0) == []
    workers = sql(app, "SELECT count(DISTINCT worker_id) FROM attempts WHERE job_id = :j", j=int(job_id))
    assert workers == [(3,)]

    # The cap is the project's max_worker_attempts: raised to 4, d may try.
    api.call("PATCH", "/api/v1/fleethq/projects/papers", {"max_worker_attempts": 4})
    _fail_by_each(app, api, [d], job_id)
    assert sweep(app)["tried_out"] == 1
    # null: no limit on distinct workers (max_resets still bounds the retries).
    api.call("PATCH", "/api/v1/fleethq/projects/papers", {"max_worker_attempts": None})
    sql(app, "UPDATE jobs SET state = 'todo' WHERE id = :j", j=job_id)
    e = live_node(client, app, name="e")
    [attempt] = claimed(e.claim("papers"), 1)
    assert attempt["job_id"] == job_id


def test_max_worker_attempts_of_one_fails_the_job_after_one_worker_tried(app, client, api):
    pdf_project(api, "papers", retry_backoff_seconds=0, max_resets=20, max_worker_attempts=1)
    enqueue(api, "papers", papers(1))
    [job_id] = [r[0] for r in sql(app, "SELECT id FROM jobs")]
    a, b = live_node(client, app, name="a"), live_node(client, app, name="b")
    _fail_by_each(app, api, [a], job_id)
    assert claimed(b.claim("papers"), 0) == []
    # With no other worker fresh, the lone worker may not retry either: the
    # cap counts the worker that tried.
    age_heartbeat(app, b)
    assert claimed(a.claim("papers"), 0) == []
    assert sweep(app)["tried_out"] == 1
    assert job_state(app, job_id) == ("failed", "no_eligible_worker")

    # A requeue would be failed again by the next sweep: refused, saying why.
    requeue = f"/api/v1/admin/projects/papers/jobs/{job_id}/requeue"
    err = api_error(api.call("POST", requeue), 400, "invalid_request")
    assert err["details"]["field"] == "max_worker_attempts" and "raise it" in err["message"]
    assert job_state(app, job_id)[0] == "failed"
    api.call("PATCH", "/api/v1/fleethq/projects/papers", {"max_worker_attempts": 2})
    assert api.call("POST", requeue).status_code == 204
    assert b.heartbeat().status_code == 200
    [retry] = claimed(b.claim("papers"), 1)
    assert retry["job_id"] == job_id


def test_max_worker_attempts_applies_to_generic_projects_when_set(app, client, api):
    api.put_project("gen", max_worker_attempts=2, max_resets=20)
    api.enqueue("gen", [{"id": "a", "value": "anything"}])
    a, b, c = (Node(client, app, name=n) for n in "abc")
    for node in (a, b):
        [job] = claimed(node.claim("gen"), 1)
        assert item_results(node.fail("gen", job, retryable=True))[0]["job_status"] == "todo"
    assert claimed(c.claim("gen"), 0) == []
    assert claimed(a.claim("gen"), 0) == []
    assert sweep(app)["tried_out"] == 1
    assert sql(app, "SELECT state, last_error ->> 'code' FROM jobs") == [
        ("failed", "no_eligible_worker")]


# --------------------------------------------------- completion and deadlines

def test_pdf_jobs_cannot_be_completed_through_the_job_protocol(app, client, api):
    pdf_project(api, "papers")
    enqueue(api, "papers", papers(1))
    node = live_node(client, app)
    [job] = claimed(node.claim("papers"), 1)
    response = node._call("POST", "/api/v1/projects/papers/jobs/complete", json={
        "worker_id": node.node_id, "items": [{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
                                              "outcome": {"kind": "success"}}]})
    assert response.status_code == 409, body(response)
    assert error_code(response) == "invalid_transition"
    assert job_state(app, job["job_id"])[0] == "wip"
    assert sql(app, "SELECT state FROM attempts WHERE id = :a", a=int(job["attempt_id"])) == [("running",)]


def test_attempt_timeout_bounds_claim_extend_and_heartbeat(app, client, api):
    pdf_project(api, "papers", attempt_timeout_seconds=30)
    enqueue(api, "papers", papers(1))
    node = live_node(client, app)
    before = time.time()
    [job] = claimed(node.claim("papers", lease_seconds=3600), 1)
    attempt_deadline, span = sql(app, "SELECT floor(extract(epoch FROM deadline_at)), "
                                      "extract(epoch FROM deadline_at - created_at) FROM attempts "
                                      "WHERE id = :a", a=int(job["attempt_id"]))[0]
    assert abs(float(span) - 30) < 1            # the attempt's execution deadline
    assert job["lease_expires_at"] == attempt_deadline
    assert job["lease_expires_at"] <= before + 32

    [ext] = item_results(extend(node, "papers", [job], 3600))
    assert ext["status"] == "applied", ext
    assert ext["lease_expires_at"] == attempt_deadline
    hb = node.heartbeat(running=[job["attempt_id"]])
    assert body(hb)["lease_expires"] == {job["attempt_id"]: attempt_deadline}
    lease = sql(app, "SELECT floor(extract(epoch FROM lease_expires_at)) FROM jobs WHERE id = :j",
                j=int(job["job_id"]))[0][0]
    assert lease == attempt_deadline


def test_task_timeout_bounds_every_lease(app, client, api):
    pdf_project(api, "papers", task_timeout_seconds=60, attempt_timeout_seconds=360)
    enqueue(api, "papers", papers(1))
    node = live_node(client, app)
    [job] = claimed(node.claim("papers", lease_seconds=3600), 1)
    # The first claim starts the task deadline: 60 s from the attempt's creation.
    [(job_deadline, span)] = sql(app, "SELECT floor(extract(epoch FROM j.deadline_at)), "
                                      "extract(epoch FROM j.deadline_at - a.created_at) "
                                      "FROM jobs j JOIN attempts a ON a.id = j.current_attempt_id")
    assert float(span) == 60
    assert job["lease_expires_at"] == job_deadline
    [ext] = item_results(extend(node, "papers", [job], 3600))
    assert ext["lease_expires_at"] == job_deadline
    assert body(node.heartbeat(running=[job["attempt_id"]]))["lease_expires"] == {
        job["attempt_id"]: job_deadline}

    # Once the task deadline has passed the job fails instead of being retried.
    sql(app, "UPDATE jobs SET deadline_at = now() - interval '1 second', "
             "lease_expires_at = now() - interval '1 second' WHERE id = :j", j=int(job["job_id"]))
    [late] = item_results(extend(node, "papers", [job], 60))
    assert late["status"] == "rejected"
    sweep(app)
    assert job_state(app, job["job_id"])[0] == "failed"
    assert claimed(node.claim("papers"), 0) == []
