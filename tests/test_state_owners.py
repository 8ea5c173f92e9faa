"""One owner for each state machine (DESIGN §4.1): only the modules declared
in ``app.projects.states.OWNERS`` write job or attempt states, and every move
they make is a declared transition.

The first half reads the source tree (app/, tasks/) with ``ast``: SQL in
string literals (adjacent literals joined, f-string holes kept as ``{…}``)
that sets ``state`` on jobs or attempts or inserts attempts, a Python
assignment to ``.state``, or a use of the shared retry SQL. The second half
records, with a row trigger, every state change PostgreSQL sees while real
claims, outcomes, expiries, uploads, archives, revocations, sweeps and
requeues run, and checks each against the declared tables.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.projects import states
from tests.fleet_helpers import Node, decide, papers, pdf_project
from tests.helpers import Api, body, sql, values
from tests.support.jobs import sweep
from tests.support.uploads import archive

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("app", "tasks")

_STATE_UPDATE = re.compile(
    r"\bUPDATE\s+(jobs|attempts)\b(?:\s+(?:AS\s+)?(?!SET\b)\w+)?\s+SET\b(.*?)"
    r"(?=\bFROM\b|\bWHERE\b|\bRETURNING\b|$)", re.I | re.S)
_SETS_STATE = re.compile(r"(?:^|,)\s*state\s*=(?!=)", re.I)
_ATTEMPT_INSERT = re.compile(r"\bINSERT\s+INTO\s+attempts\b", re.I)
_SHARED_SQL = {"retry_set", "retry_state"}


def _literal(node) -> str | None:
    """The text of a string literal; an f-string with ``{…}`` for its holes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{…}" for v in node.values)
    return None


def state_writes(source: str) -> list[str]:
    """What in this Python source writes job or attempt states."""
    found = []
    for node in ast.walk(ast.parse(source)):
        text = _literal(node)
        if text is not None:
            for table, set_list in _STATE_UPDATE.findall(text):
                if _SETS_STATE.search(set_list):
                    found.append(f"UPDATE {table} … SET state")
            if _ATTEMPT_INSERT.search(text):
                found.append("INSERT INTO attempts")
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        found += [".state assignment" for t in targets
                  if isinstance(t, ast.Attribute) and t.attr == "state"]
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if name in _SHARED_SQL:
            found.append(f"uses states.{name}")
    return sorted(set(found))  # an f-string's literal parts are visited on their own too


def source_writers() -> dict[str, list[str]]:
    writers = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "app/projects/states.py":
                continue
            found = state_writes(path.read_text(encoding="utf-8"))
            if found:
                writers[rel] = found
    return writers


# ------------------------------------------------------------ the source

@pytest.mark.parametrize("snippet, expected", [
    ('db.execute(text("UPDATE jobs SET state = \'done\' WHERE id = :j"))',
     ["UPDATE jobs … SET state"]),
    ('SQL = ("UPDATE attempts a SET finished_at = now(), "\n       "state = \'failed\' WHERE a.id = 1")',
     ["UPDATE attempts … SET state"]),
    ('SQL = f"UPDATE jobs AS j SET updated_at = now(), state = {x} FROM t"',
     ["UPDATE jobs … SET state"]),
    ('SQL = """INSERT INTO attempts (job_id) VALUES (1)"""', ["INSERT INTO attempts"]),
    ('job.state = "todo"', [".state assignment"]),
    ('SQL = f"UPDATE jobs j SET {states.retry_set(\'a\', \'b\')}"', ["uses states.retry_set"]),
    ('SQL = "UPDATE jobs j SET lease_expires_at = now() WHERE j.state = \'wip\'"', []),
    ('SQL = "UPDATE uploads SET state = \'held\' WHERE attempt_id = 1"', []),
    ('SQL = "SELECT state FROM attempts WHERE id = 1"', []),
])
def test_the_scan_finds_state_writes(snippet, expected):
    assert state_writes(snippet) == expected


def test_only_the_declared_owners_write_job_or_attempt_states():
    writers = source_writers()
    strangers = {path: found for path, found in writers.items() if path not in states.OWNERS}
    assert strangers == {}, ("job and attempt states belong to app.projects.states.OWNERS; "
                             f"move these writes there: {strangers}")
    # And the declaration is not stale: every owner does write states.
    assert set(writers) == set(states.OWNERS), writers


# ------------------------------------------------------- observed moves

_RECORDER = [
    "CREATE TABLE state_moves (tbl text NOT NULL, from_state text, to_state text NOT NULL)",
    """CREATE FUNCTION record_state_move() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO state_moves VALUES (TG_TABLE_NAME, NULL, NEW.state);
        ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
            INSERT INTO state_moves VALUES (TG_TABLE_NAME, OLD.state, NEW.state);
        END IF;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER record_job_moves AFTER INSERT OR UPDATE ON jobs "
    "FOR EACH ROW EXECUTE FUNCTION record_state_move()",
    "CREATE TRIGGER record_attempt_moves AFTER INSERT OR UPDATE ON attempts "
    "FOR EACH ROW EXECUTE FUNCTION record_state_move()",
]


@pytest.fixture
def moves(app):
    for statement in _RECORDER:
        sql(app, statement)
    try:
        yield lambda table: {(f, t) for f, t in sql(
            app, "SELECT DISTINCT from_state, to_state FROM state_moves WHERE tbl = :t", t=table)}
    finally:
        for statement in ("DROP TRIGGER record_job_moves ON jobs",
                          "DROP TRIGGER record_attempt_moves ON attempts",
                          "DROP FUNCTION record_state_move()", "DROP TABLE state_moves"):
            sql(app, statement)


def age_lease(app, job_id) -> None:
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :j",
        j=int(job_id))
    sql(app, "UPDATE attempts SET lease_expires_at = now() - interval '1 second' "
             "WHERE job_id = :j AND state = 'running'", j=int(job_id))


def one(response) -> dict:
    assert response.status_code == 200, body(response)
    [job] = body(response)["jobs"]
    return job


def _generic_moves(app, api) -> None:
    """Claim, complete, fail both ways, expire to exhaustion, a passed
    deadline, and the admin's requeues, on a generic project."""
    api.put_project("gen", max_resets=1, task_timeout_seconds=600)
    api.enqueue("gen", values(4))
    api.complete("gen", [one(api.claim("gen", max_jobs=1))])
    failed = one(api.claim("gen", max_jobs=1))
    api.fail("gen", [failed], retryable=False)
    assert api.call("POST", f"/api/v1/admin/projects/gen/jobs/{failed['job_id']}/requeue"
                    ).status_code == 204
    for _ in range(2):   # the second expiry uses up max_resets = 1
        expiring = one(api.claim("gen", max_jobs=1))
        age_lease(app, expiring["job_id"])
        sweep(app)
    assert api.call("POST", f"/api/v1/admin/projects/gen/jobs/{expiring['job_id']}/requeue"
                    ).status_code == 204
    retried = one(api.claim("gen", max_jobs=1))
    api.fail("gen", [retried], retryable=True)
    sql(app, "UPDATE jobs SET deadline_at = now() - interval '1 second' WHERE id = :j",
        j=retried["job_id"])
    sweep(app)   # todo past its task deadline → failed


def _pdf_moves(app, client, api, files) -> None:
    """Upload, stage, archive; a rejected file; a late upload after expiry;
    a revoked worker; staged retention; a job tried out by its workers."""
    pdf_project(api, "papers", retry_backoff_seconds=0, max_worker_attempts=1, max_resets=20)
    api.enqueue("papers", papers(6))
    node = Node(client, app, name="a")
    assert node.heartbeat().status_code == 200
    good = one(node.claim("papers"))
    assert node.upload(good["attempt_id"], files["good"]).status_code == 202
    assert archive(app, good["attempt_id"]) == "done"

    bad = one(node.claim("papers"))
    assert node.upload(bad["attempt_id"], files["html"]).status_code == 422
    late = one(node.claim("papers"))
    age_lease(app, late["job_id"])
    sweep(app)   # the first rejected job is tried out (max_worker_attempts = 1)
    assert node.upload(late["attempt_id"], files["good"]).status_code == 202

    from app.extensions import db
    from app.uploads import transitions
    with app.app_context():
        transitions.expire_staged(retention_s=0)
        db.session.remove()

    revoked = Node(client, app, name="revoked")
    assert revoked.heartbeat().status_code == 200
    one(revoked.claim("papers"))
    decide(app, revoked.node_id, "revoke")


def test_every_observed_transition_is_declared(app, client, admin_token, dirs, files, moves):
    api = Api(client, admin_token)
    _generic_moves(app, api)
    _pdf_moves(app, client, api, files)

    jobs, attempts = moves("jobs"), moves("attempts")
    assert jobs - set(states.JOB_TRANSITIONS) == set(), jobs
    assert attempts - set(states.ATTEMPT_TRANSITIONS) == set(), attempts
    # The scenario did make the moves it is meant to show.
    assert {(None, "todo"), ("todo", "wip"), ("wip", "done"), ("wip", "failed"),
            ("failed", "todo"), ("wip", "todo"), ("wip", "reset_exhausted"),
            ("reset_exhausted", "todo"), ("todo", "failed"), ("wip", "staged"),
            ("staged", "done"), ("staged", "failed")} <= jobs, jobs
    assert {(None, "running"), ("running", "done"), ("running", "failed"),
            ("running", "expired"), ("running", "uploading"), ("uploading", "staged"),
            ("staged", "done"), ("uploading", "failed"), ("expired", "uploading"),
            ("staged", "failed"), ("running", "cancelled")} <= attempts, attempts
