"""The audit log (issue "Pages an operator lives in" §3): every admin and
fleet action writes who, what, on which object and why, in the action's own
transaction, whichever entry point asked; the page and ``flask fleet audit``
list and filter it; retention prunes it."""
from __future__ import annotations

import json
import socket

import pytest

from tests.fleet_helpers import Node
from tests.helpers import Api, body, sql, values
from tests.support.pages import Pages, XSS, sign_in


@pytest.fixture
def pages(app, client):
    sign_in(app, client)
    return Pages(client, "page-admin")


def _rows(app, **where):
    clause = " AND ".join(f"{k} = :{k}" for k in where) or "true"
    return [r._asdict() for r in sql(app, f"SELECT actor, action, object_kind, object_id, details, reason "
                                          f"FROM audit_log WHERE {clause} ORDER BY id", **where)]


def _cli(app, *args):
    result = app.test_cli_runner().invoke(args=["fleet", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_page_actions_are_recorded_as_the_signed_in_admin(app, pages):
    pages.act("/admin/projects", {"id": "audited", "kind": "generic", "identity_mode": "external_id",
                                  "client_versions": ""})
    pages.act("/admin/projects/audited/status", {"status": "draining"})
    (created,) = _rows(app, action="project.create")
    assert (created["actor"], created["object_kind"], created["object_id"]) == (
        "user:page-admin", "project", "audited")
    assert created["details"]["identity_mode"] == "external_id"
    (status,) = _rows(app, action="project.status")
    assert status["details"] == {"from": "active", "to": "draining"}


def test_api_actions_name_the_token_user_and_sizes_not_bodies(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("sized")
    assert api.enqueue("sized", values(3)).status_code in (200, 201)
    assert api.enqueue("sized", values(3)).status_code in (200, 201)  # all three already there
    (enqueued,) = _rows(app, action="jobs.enqueue")    # one run of batches: one row
    assert {k: enqueued["details"][k] for k in ("submitted", "inserted", "batches")} == {
        "submitted": 6, "inserted": 3, "batches": 2}
    assert enqueued["actor"] == "user:admin"


def test_a_refused_action_leaves_no_audit_row(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("fixed", identity_mode="external_id")
    before = len(_rows(app))
    # identity_mode is fixed at creation: refused, and nothing is recorded.
    response = api.call("PATCH", "/api/v1/fleethq/projects/fixed", {"identity_mode": "unique_value"})
    assert response.status_code == 400, body(response)
    assert len(_rows(app)) == before


def test_revoke_and_reject_need_a_reason_and_keep_it(app, client, pages):
    node = Node(client, app, name="to-revoke")
    url = f"/admin/workers/node/{node.node_id}/revoke"
    message, _ = pages.act(url, {"confirm": "yes"}, expect="error")
    assert "needs a reason" in message
    assert sql(app, "SELECT status FROM fleet_nodes WHERE id = :i", i=node.node_id)[0][0] == "active"
    pages.act(url, {"confirm": "yes", "reason": f"stolen laptop {XSS}"})
    (revoked,) = _rows(app, action="node.revoke")
    assert revoked["actor"] == "user:page-admin" and revoked["object_id"] == node.node_id
    assert revoked["reason"] == f"stolen laptop {XSS}"
    assert revoked["details"] == {"cancelled_attempts": 0, "held_uploads": 0}
    shown = pages.text("/admin/audit?action=node.")
    assert "stolen laptop &lt;script&gt;" in shown and XSS not in shown
    pending = Node(client, app, name="stranger", approve=False)
    pages.act(f"/admin/workers/node/{pending.node_id}/reject", {"confirm": "yes", "reason": "unknown"})
    assert _rows(app, action="node.reject")[0]["reason"] == "unknown"


def test_bulk_delete_needs_a_reason(app, client, pages, admin_token):
    api = Api(client, admin_token)
    api.put_project("bulk")
    api.enqueue("bulk", values(2))
    ids = [r[0] for r in sql(app, "SELECT id FROM jobs WHERE project_id = 'bulk' ORDER BY id")]
    form = {"action": "delete", "confirm": "yes", "job_id": [str(i) for i in ids]}
    message, _ = pages.act("/admin/projects/bulk/jobs/bulk", form, expect="error")
    assert "reason" in message and len(sql(app, "SELECT id FROM jobs")) == 2
    pages.act("/admin/projects/bulk/jobs/bulk", {**form, "reason": "test data"})
    deleted = _rows(app, action="job.delete")
    assert [(r["object_id"], r["reason"], r["details"]["state"]) for r in deleted] == [
        (str(i), "test data", "todo") for i in ids]


def test_user_token_hook_and_fleet_changes_are_recorded(app, client, pages, admin_token):
    from app.accounts import service as accounts
    from app.extensions import db
    api = Api(client, admin_token)
    with app.app_context():
        accounts.put_user("vol", ["worker"], "active")
        accounts.rotate_token("vol")
        accounts.revoke_token("vol")
        accounts.put_user("vol", ["worker"], "suspended")
        accounts.delete_user("vol")
        db.session.remove()
    assert [r["action"] for r in _rows(app, object_id="vol")] == [
        "user.create", "token.rotate", "token.revoke", "user.update", "user.delete"]
    api.put_project("hooked")
    made = api.call("POST", "/api/v1/admin/projects/hooked/hooks", {
        "name": "idx", "url": "https://hooks.example.org/x", "secret": "s" * 20})
    assert made.status_code == 201, body(made)
    (hook,) = _rows(app, action="hook.create")
    assert "s" * 20 not in json.dumps(hook["details"])  # never the secret
    pages.post("/admin/workers/enrollments")
    assert _rows(app, action="node.enrollment")[0]["details"] == {"valid_minutes": 15}
    node = Node(client, app, name="tiered")
    pages.act(f"/admin/workers/node/{node.node_id}/tier", {"tier": "fallback"})
    assert _rows(app, action="node.tier")[0]["details"] == {"tier": "fallback"}


def test_cli_actions_name_the_master_host_and_the_cli_prints_the_log(app):
    _cli(app, "put-user", "cli-made", "--roles", "worker")
    (row,) = _rows(app, object_id="cli-made")
    assert row["actor"] == f"cli@{socket.gethostname()}" and row["action"] == "user.create"
    _cli(app, "rotate-token", "cli-made")
    printed = _cli(app, "audit").splitlines()
    assert len(printed) == 2 and "token.rotate  user:cli-made" in printed[0]
    assert "user.create  user:cli-made" in printed[1] and '"roles":["worker"]' in printed[1]
    only = [json.loads(line) for line in _cli(app, "audit", "--action", "user.", "--json").splitlines()]
    assert [e["action"] for e in only] == ["user.create"]
    assert _cli(app, "audit", "--object", "project:none") == ""


def test_the_page_filters_and_pages_by_id(app, pages, client, admin_token):
    api = Api(client, admin_token)
    for n in range(105):
        api.put_project(f"p{n:03d}")
    first = pages.text("/admin/audit?object_kind=project")
    assert first.count("<code>project.create</code>") == 100
    older = pages.get("/admin/audit?object_kind=project&before_id="
                      + str(sql(app, "SELECT min(id) FROM "
                                     "(SELECT id FROM audit_log ORDER BY id DESC LIMIT 100) t")[0][0]))
    assert older.get_data(as_text=True).count("<code>project.create</code>") == 5
    assert 'href="/admin/audit?before_id=' in first and "object_kind=project" in first
    assert "p000" not in pages.text("/admin/audit?object_id=p104")
    assert "No audit rows match this filter" in pages.text("/admin/audit?actor=nobody")


def test_reasons_and_details_are_bounded(app):
    from app import audit
    from app.extensions import db
    with app.app_context():
        audit.acting_as("user:t")
        audit.record("test.long", "test", "1", {"ids": list(range(5000))}, reason="r" * 5000)
        db.session.commit()
        db.session.remove()
    (row,) = _rows(app, action="test.long")
    assert len(row["reason"]) == audit.REASON_MAX
    assert row["details"]["truncated"] is True and row["details"]["bytes"] > audit.DETAILS_MAX_BYTES


def test_retention_prunes_old_rows_only(app, client, admin_token):
    from app.ops import retention
    api = Api(client, admin_token)
    api.put_project("old")
    api.put_project("new")
    sql(app, "UPDATE audit_log SET at = now() - interval '400 days' WHERE object_id = 'old'")
    with app.app_context():
        pruned = retention.run({**app.config, "KEEP_AUDIT_DAYS": 365})
    assert pruned["audit_log"] == 1
    assert [r["object_id"] for r in _rows(app, object_kind="project")] == ["new"]


def test_a_run_of_enqueue_batches_is_one_row_with_its_totals(app, client, admin_token, make_user):
    api = Api(client, admin_token)
    api.put_project("bulk-audit")
    for batch in range(10):                          # hqctl enqueue: 1,000 a request
        jobs = [{"id": f"j{batch}-{n}", "value": f"https://example.org/{batch}/{n}"} for n in range(100)]
        assert api.enqueue("bulk-audit", jobs).status_code in (200, 201)
    (run,) = _rows(app, action="jobs.enqueue", object_id="bulk-audit")
    assert {k: run["details"][k] for k in ("submitted", "inserted", "batches")} == {
        "submitted": 1000, "inserted": 1000, "batches": 10}
    # Another actor's batches are their own run; a batch after a pause starts a new one.
    other = Api(client, make_user("other-admin", ["admin"]))
    assert other.enqueue("bulk-audit", values(2)).status_code in (200, 201)
    sql(app, "UPDATE audit_log SET details = details || jsonb_build_object('last_at', now() - interval '2 minutes')")
    assert api.enqueue("bulk-audit", values(1)).status_code in (200, 201)
    rows = _rows(app, action="jobs.enqueue", object_id="bulk-audit")
    assert [(r["actor"], r["details"]["submitted"], r["details"]["batches"]) for r in rows] == [
        ("user:admin", 1000, 10), ("user:other-admin", 2, 1), ("user:admin", 1, 1)]


def test_audit_cli_pages_and_filters_by_time(app, client, admin_token):
    api = Api(client, admin_token)
    for n in range(5):
        api.put_project(f"paged-{n}")
    sql(app, "UPDATE audit_log SET at = now() - interval '3 hours' WHERE object_id IN ('paged-0', 'paged-1')")
    runner = app.test_cli_runner()
    first = runner.invoke(args=["fleet", "audit", "--action", "project.create", "--limit", "2"])
    assert first.exit_code == 0, first.output
    assert "paged-4" in first.output and "paged-3" in first.output and "paged-2" not in first.output
    hint = first.output.strip().splitlines()[-1]
    assert hint.startswith("more: the same command with --before-id ")
    before = hint.rsplit(" ", 1)[1]
    second = runner.invoke(args=["fleet", "audit", "--action", "project.create", "--limit", "2",
                                 "--before-id", before])
    assert "paged-2" in second.output and "paged-4" not in second.output
    recent = runner.invoke(args=["fleet", "audit", "--action", "project.create", "--since", "1h"])
    assert "paged-2" in recent.output and "paged-1" not in recent.output
    older = runner.invoke(args=["fleet", "audit", "--action", "project.create", "--until", "2h", "--json"])
    assert [json.loads(line)["object_id"] for line in older.output.splitlines()] == ["paged-1", "paged-0"]
    bad = runner.invoke(args=["fleet", "audit", "--since", "yesterday"])
    assert bad.exit_code == 2 and "neither an ISO 8601 time" in bad.output

