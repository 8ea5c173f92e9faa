"""SavewebHQ's own server and FleetHQ, side by side, answer the same requests
the same way.

SavewebHQ's ``tracker`` (tests/savewebhq_programs.py) and FleetHQ served as
deployed (gunicorn) hold the same users with the same machine tokens; one
script of requests — every one of the contract's 23 operations with good
input and with bad — goes to both, each side filling in the job and attempt
ids its own earlier answers gave. Each pair of answers must agree on the
status, the headers SavewebHQ's clients read (``Content-Type``,
``Cache-Control``, ``Retry-After``) and the body: the same keys at every
level, the same JSON types, and the same values but where a value is
naturally the server's own (ids, times, tokens, human-readable messages).

What still differs is listed in ``DELIBERATE`` with its reason, as
docs/protocol.md does; a difference not listed fails the test, and so does a
listed one that no longer happens.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.gunicorn_master import Gunicorn
from tests.savewebhq_programs import CLIENT_VERSION, Tracker, install_user, token_file
from tests.savewebhq_wire import (NO_BODY, SUCCESS, Answer, Wire, admin_path, project_body, receipt,
                                  source_file, worker_path)

P = "diff"

# Values that are each server's own: compared by type only.
OWN_VALUES = {"job_id", "attempt_id", "token", "message", "after_job_id", "next_after_job_id",
              "random_key"}

# Differences that are deliberate, each with its reason (docs/protocol.md,
# "Differences from SavewebHQ's tracker"): (step, where) -> why, "where" as
# ``compare`` names the place.
DELIBERATE: dict[tuple[str, str], str] = {
    ("health", "header Cache-Control"):
        "FleetHQ's /healthz says no-store: a live status a proxy must not keep",
    ("put project with max_jobs_per_claim 0", "status"):
        "the contract's minimum is 1; SavewebHQ takes 0 as its default (256), FleetHQ refuses it",
    ("claim without policy_version", "status"):
        "FleetHQ's own workers claim without it; SavewebHQ's clients always send it",
    ("extend lease of another worker", "body.results[0].error.details"):
        "the contract types details as an object: FleetHQ sends {}, SavewebHQ null (a Go nil map)",
    ("extend lease with a wrong attempt", "body.results[0].error.details"):
        "the contract types details as an object: FleetHQ sends {}, SavewebHQ null (a Go nil map)",
    ("fail a finished job", "body.results[0].error.details"):
        "the contract types details as an object: FleetHQ sends {}, SavewebHQ null (a Go nil map)",
    ("complete again", "body.results[0].status"):
        "a replayed completion (same attempt, same payload) is applied again, so a lost answer "
        "is harmless; SavewebHQ rejects it as stale_attempt",
    ("complete again", "body.results[0].job_status"): "as above: the replay is applied",
    ("complete again", "body.results[0].error"): "as above: the replay is applied",
}


def extra_detail(where: str, what: str) -> bool:
    """FleetHQ's error envelopes name what they are about in ``error.details``
    (the field, index, id or state) where SavewebHQ's are empty: a key more in
    an open object, which its clients do not read."""
    return where.startswith("body.error.details.") and what.strip() == "only FleetHQ has it"


@pytest.fixture(scope="module")
def servers(app, database_url, tmp_path_factory):
    directory = tmp_path_factory.mktemp("differential")
    tracker = Tracker(directory / "tracker.log")
    # The test app's secret key: the tokens it installs are sealed under it
    # and stay viewable, as SavewebHQ's are.
    master = Gunicorn({"DATABASE_URL": database_url, "GUNICORN_CMD_ARGS": "",
                       "FLEETHQ_WEB_WORKERS": "2", "FLEETHQ_SECRET_KEY": app.config["SECRET_KEY"]},
                      directory / "gunicorn.log")
    try:
        master.wait_ready()
        yield tracker, master, directory
    finally:
        master.stop()
        tracker.stop()


@dataclass
class Side:
    """One server and what its own answers told the script so far."""
    name: str
    url: str
    tokens: dict
    ids: dict = field(default_factory=dict)

    def wire(self, who: str | None, version: str | None = CLIENT_VERSION) -> Wire:
        return Wire(self.url, self.tokens.get(who), version)


@dataclass
class Step:
    name: str
    who: str | None
    method: str
    path: str | Callable
    body: object = NO_BODY
    raw: bytes | None = None
    content_type: str | None = "application/json"
    version: str | None = CLIENT_VERSION
    keep: Callable | None = None  # (ids, json) -> None: remember what later steps need


def claimed(name: str):
    def keep(ids, data):
        ids[name] = sorted(data["jobs"], key=lambda job: job["id"])
    return keep


def ref(ids, name, index=0, **overrides):
    job = ids[name][index]
    return {"job_id": job["job_id"], "attempt_id": job["attempt_id"], **overrides}


def job_path(name, index=0, tail=""):
    return lambda ids: admin_path(P, f"/jobs/{ids[name][index]['job_id']}{tail}")


USERS = "/api/v1/admin/users"
WORKER = {"roles": ["worker"], "status": "active"}


def script() -> list[Step]:
    jobs = [{"id": f"j{i}", "value": f"https://example.test/{i}", "type": "seed"} for i in range(6)]
    steps = [
        Step("health", None, "GET", "/healthz", version=None),
        Step("whoami", "worker", "GET", "/api/v1/whoami"),
        Step("whoami without a token", None, "GET", "/api/v1/whoami"),
        Step("whoami with an unknown token", "stranger", "GET", "/api/v1/whoami"),
        Step("admin route as a worker", "worker", "GET", "/api/v1/admin/projects"),
        Step("unknown route", "admin", "GET", "/api/v1/nothing-here"),
        Step("wrong method", "admin", "PUT", "/api/v1/whoami", body={}),
        # Users
        Step("put user", "admin", "PUT", USERS + "/u1", body=WORKER),
        Step("put user again", "admin", "PUT", USERS + "/u1", body={"roles": ["worker", "admin"], "status": "active"}),
        Step("put user with an unknown role", "admin", "PUT", USERS + "/u2",
             body={"roles": ["boss"], "status": "active"}),
        Step("put user with a bad id", "admin", "PUT", USERS + "/a%20b", body=WORKER),
        Step("put user with an unknown field", "admin", "PUT", USERS + "/u2",
             body={"roles": ["worker"], "status": "active", "x": 1}),
        Step("put user with broken JSON", "admin", "PUT", USERS + "/u2", raw=b'{"roles": [', body=NO_BODY),
        Step("list users", "admin", "GET", USERS),
        Step("token of a user without one", "admin", "GET", USERS + "/u1/machine-token"),
        Step("rotate token", "admin", "POST", USERS + "/u1/machine-token"),
        Step("view token", "admin", "GET", USERS + "/u1/machine-token"),
        Step("revoke token", "admin", "DELETE", USERS + "/u1/machine-token"),
        Step("revoke token again", "admin", "DELETE", USERS + "/u1/machine-token"),
        Step("token of an unknown user", "admin", "POST", USERS + "/nobody/machine-token"),
        Step("delete user", "admin", "DELETE", USERS + "/u1"),
        Step("delete unknown user", "admin", "DELETE", USERS + "/u1"),
        # Projects
        Step("put project", "admin", "PUT", admin_path(P), body=project_body(max_jobs_per_claim=4)),
        Step("put project again", "admin", "PUT", admin_path(P), body=project_body(max_jobs_per_claim=8)),
        Step("list projects", "admin", "GET", "/api/v1/admin/projects"),
        Step("put project with max_jobs_per_claim 0", "admin", "PUT", admin_path("bad"),
             body=project_body(max_jobs_per_claim=0)),
        Step("put project with an unknown identity mode", "admin", "PUT", admin_path("bad"),
             body=project_body(identity_mode="name")),
        Step("put project with an unknown field", "admin", "PUT", admin_path("bad"), body=project_body(colour="red")),
        Step("get project", "admin", "GET", admin_path(P)),
        Step("get unknown project", "admin", "GET", admin_path("nothing")),
        # Enqueue
        Step("enqueue", "admin", "POST", admin_path(P, "/jobs"), body={"jobs": jobs}),
        Step("enqueue the same again", "admin", "POST", admin_path(P, "/jobs"), body={"jobs": jobs[:2]}),
        Step("enqueue nothing", "admin", "POST", admin_path(P, "/jobs"), body={"jobs": []}),
        Step("enqueue an empty value", "admin", "POST", admin_path(P, "/jobs"),
             body={"jobs": [{"id": "e", "value": ""}]}),
        Step("enqueue an unknown type", "admin", "POST", admin_path(P, "/jobs"),
             body={"jobs": [{"id": "e", "value": "v", "type": "page"}]}),
        Step("enqueue into an unknown project", "admin", "POST", admin_path("nothing", "/jobs"),
             body={"jobs": jobs[:1]}),
        Step("enqueue a source", "admin", "POST", admin_path(P, "/source"), body=NO_BODY,
             raw=source_file([{"id": f"s{i}", "value": f"https://example.test/s/{i}"} for i in range(3)]),
             content_type="application/zstd"),
        Step("enqueue a source that is not zstd", "admin", "POST", admin_path(P, "/source"), body=NO_BODY,
             raw=b"not zstd", content_type="application/zstd"),
        Step("list jobs", "admin", "GET", admin_path(P, "/jobs?status=todo&limit=2")),
        Step("list jobs with limit 0", "admin", "GET", admin_path(P, "/jobs?limit=0")),
        Step("list jobs with an unknown status", "admin", "GET", admin_path(P, "/jobs?status=lost")),
        # The worker side
        Step("policy", "worker", "GET", worker_path(P)),
        Step("policy of an unknown project", "worker", "GET", worker_path("nothing")),
        Step("policy without a client version", "worker", "GET", worker_path(P), version=None),
        Step("policy for an old client", "worker", "GET", worker_path(P), version="old-1"),
        Step("claim", "worker", "POST", worker_path(P, "/jobs/claim"),
             body={"worker_id": "w1", "max_jobs": 4, "lease_seconds": 300, "accept_types": ["seed"],
                   "policy_version": 2}, keep=claimed("first")),
        Step("claim max_jobs 0", "worker", "POST", worker_path(P, "/jobs/claim"),
             body={"worker_id": "w1", "max_jobs": 0, "lease_seconds": 300, "accept_types": [], "policy_version": 2}),
        Step("claim lease 0", "worker", "POST", worker_path(P, "/jobs/claim"),
             body={"worker_id": "w1", "max_jobs": 1, "lease_seconds": 0, "accept_types": [], "policy_version": 2}),
        Step("claim an unknown type", "worker", "POST", worker_path(P, "/jobs/claim"),
             body={"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60, "accept_types": ["page"],
                   "policy_version": 2}),
        # (asset jobs only, of which there are none: FleetHQ's answer hands out nothing)
        Step("claim without policy_version", "worker", "POST", worker_path(P, "/jobs/claim"),
             body={"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60, "accept_types": ["asset"]}),
        Step("claim from an unknown project", "worker", "POST", worker_path("nothing", "/jobs/claim"),
             body={"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60, "accept_types": [], "policy_version": 1}),
        Step("claim as an admin without the worker role", "admin", "POST", worker_path(P, "/jobs/claim"),
             body={"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60, "accept_types": [], "policy_version": 2}),
        Step("extend lease", "worker", "POST", worker_path(P, "/jobs/extend-lease"),
             body=lambda ids: {"worker_id": "w1", "extend_seconds": 120, "items": [ref(ids, "first", 0)]}),
        Step("extend lease by 0", "worker", "POST", worker_path(P, "/jobs/extend-lease"),
             body=lambda ids: {"worker_id": "w1", "extend_seconds": 0, "items": [ref(ids, "first", 0)]}),
        Step("extend lease of another worker", "worker", "POST", worker_path(P, "/jobs/extend-lease"),
             body=lambda ids: {"worker_id": "w2", "extend_seconds": 60, "items": [ref(ids, "first", 0)]}),
        Step("extend lease with a wrong attempt", "worker", "POST", worker_path(P, "/jobs/extend-lease"),
             body=lambda ids: {"worker_id": "w1", "extend_seconds": 60,
                               "items": [ref(ids, "first", 0, attempt_id="not-this-one")]}),
        Step("complete", "worker", "POST", worker_path(P, "/jobs/complete"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 0), "outcome": SUCCESS, "artifact_receipts": [receipt(0)]}]}),
        Step("complete again", "worker", "POST", worker_path(P, "/jobs/complete"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 0), "outcome": SUCCESS, "artifact_receipts": [receipt(0)]}]}),
        Step("complete with an unknown outcome", "worker", "POST", worker_path(P, "/jobs/complete"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 1), "outcome": {"kind": "great"}, "artifact_receipts": []}]}),
        Step("complete with a bad receipt checksum", "worker", "POST", worker_path(P, "/jobs/complete"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 1), "outcome": SUCCESS,
                  "artifact_receipts": [receipt(1, checksum="sha256:not-hex")]}]}),
        Step("complete with no items", "worker", "POST", worker_path(P, "/jobs/complete"),
             body={"worker_id": "w1", "items": []}),
        Step("fail retryable", "worker", "POST", worker_path(P, "/jobs/fail"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 1), "retryable": True,
                  "error": {"code": "temporary", "message": "later", "details": {}}}]}),
        Step("fail permanently", "worker", "POST", worker_path(P, "/jobs/fail"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 2), "retryable": False,
                  "error": {"code": "gone", "message": "never", "details": {"why": 1}}}]}),
        Step("fail with a bad error code", "worker", "POST", worker_path(P, "/jobs/fail"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 3), "retryable": False,
                  "error": {"code": "no spaces", "message": "x", "details": {}}}]}),
        Step("fail a finished job", "worker", "POST", worker_path(P, "/jobs/fail"),
             body=lambda ids: {"worker_id": "w1", "items": [
                 {**ref(ids, "first", 0), "retryable": False,
                  "error": {"code": "late", "message": "x", "details": {}}}]}),
        # Admin job views and actions
        Step("get a done job", "admin", "GET", job_path("first", 0)),
        Step("get a failed job", "admin", "GET", job_path("first", 2)),
        Step("get an unknown job", "admin", "GET", admin_path(P, "/jobs/999999")),
        Step("get a job by a bad id", "admin", "GET", admin_path(P, "/jobs/abc")),
        Step("requeue a failed job", "admin", "POST", job_path("first", 2, "/requeue")),
        Step("requeue a done job", "admin", "POST", job_path("first", 0, "/requeue")),
        Step("delete a leased job", "admin", "DELETE", job_path("first", 3)),
        Step("delete a done job", "admin", "DELETE", job_path("first", 0)),
        Step("delete it again", "admin", "DELETE", job_path("first", 0)),
        Step("list failed jobs", "admin", "GET", admin_path(P, "/jobs?status=failed")),
        Step("project counts", "admin", "GET", admin_path(P)),
        Step("archive project", "admin", "PUT", admin_path(P), body=project_body(status="archived")),
        Step("enqueue into an archived project", "admin", "POST", admin_path(P, "/jobs"), body={"jobs": jobs[:1]}),
        Step("delete project", "admin", "DELETE", admin_path(P)),
        Step("delete unknown project", "admin", "DELETE", admin_path("nothing")),
    ]
    return steps


def send(side: Side, step: Step) -> Answer:
    path = step.path(side.ids) if callable(step.path) else step.path
    body = step.body(side.ids) if callable(step.body) else step.body
    wire = side.wire(step.who, step.version)
    answer = wire.call(step.method, path, body, raw=step.raw, content_type=step.content_type)
    wire.session.close()
    if step.keep is not None and 200 <= answer.status < 300:
        step.keep(side.ids, answer.json())
    return answer


def media(answer: Answer) -> str:
    return answer.headers.get("Content-Type", "").split(";")[0].strip()


def diff(ours, theirs, where: str = "body") -> list[str]:
    """Where two JSON values differ in keys, types or (but for each server's own values) values."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        found = [f"{where}.{key}: only SavewebHQ has it" for key in theirs if key not in ours]
        found += [f"{where}.{key}: only FleetHQ has it" for key in ours if key not in theirs]
        for key in theirs.keys() & ours.keys():
            if key in OWN_VALUES or key.endswith("_at"):
                if type(ours[key]) is not type(theirs[key]):
                    found.append(f"{where}.{key}: type {type(ours[key]).__name__} vs {type(theirs[key]).__name__}")
            else:
                found += diff(ours[key], theirs[key], f"{where}.{key}")
        return found
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(ours) != len(theirs):
            return [f"{where}: {len(ours)} items vs {len(theirs)}"]
        return [line for i, (a, b) in enumerate(zip(ours, theirs)) for line in diff(a, b, f"{where}[{i}]")]
    if type(ours) is not type(theirs) or ours != theirs:
        return [f"{where}: {json.dumps(ours)[:120]} vs {json.dumps(theirs)[:120]}"]
    return []


def compare(ours: Answer, theirs: Answer) -> list[str]:
    found = []
    if ours.status != theirs.status:
        found.append(f"status: {ours.status} vs {theirs.status}")
    for header in ("Cache-Control", "Retry-After"):
        if ours.headers.get(header) != theirs.headers.get(header):
            found.append(f"header {header}: {ours.headers.get(header)!r} vs {theirs.headers.get(header)!r}")
    if media(ours) != media(theirs):
        found.append(f"header Content-Type: {media(ours)!r} vs {media(theirs)!r}")
    elif media(theirs) == "application/json" and ours.status == theirs.status:
        found += diff(ours.json(), theirs.json())
    return found


def test_savewebhq_and_fleethq_answer_every_operation_alike(app, servers):
    tracker, master, directory = servers
    tokens = {}
    for who, roles in (("admin", "admin"), ("worker", "worker")):
        path, tokens[who] = token_file(directory, who)
        tracker.bootstrap_user(f"hq-{who}", roles, path)
        install_user(app, f"hq-{who}", [roles], tokens[who])
    tokens["stranger"] = "hq_" + "s" * 43
    savewebhq = Side("SavewebHQ", tracker.url, tokens)
    fleethq = Side("FleetHQ", master.url, tokens)
    report, seen, details_named = [], set(), 0
    for step in script():
        theirs, ours = send(savewebhq, step), send(fleethq, step)
        for difference in compare(ours, theirs):
            where, _, what = difference.partition(":")
            if (step.name, where) in DELIBERATE:
                seen.add((step.name, where))
                continue
            if extra_detail(where, what):
                details_named += 1
                continue
            report.append(f"[{step.name}] {step.method} {difference}\n    FleetHQ:   {ours.excerpt(300)}"
                          f"\n    SavewebHQ: {theirs.excerpt(300)}")
    stale = sorted(set(DELIBERATE) - seen)
    assert not report, f"{len(report)} undocumented differences:\n" + "\n".join(report)
    assert not stale, f"listed as deliberate but no longer different: {stale}"
    assert details_named > 0, "FleetHQ's error details no longer differ: drop extra_detail"
