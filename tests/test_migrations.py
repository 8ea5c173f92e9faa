"""Migrations (DESIGN §13): no drift between models and migrations, a clean
downgrade/upgrade cycle, the counter triggers, and the newer-schema guard."""
from __future__ import annotations

from tests.conftest import make_app
from tests.helpers import latest_revision


import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text


from tests.helpers import Api, body, values

APP_TABLES = {"attempt_totals", "attempts", "job_counts", "jobs", "machine_tokens",
              "project_dispatch", "projects", "users"}
TRIGGERS = {("jobs", "jobs_count_insert"), ("jobs", "jobs_count_update"),
            ("jobs", "jobs_count_delete"), ("attempts", "attempts_total_insert"),
            ("attempts", "attempts_total_update")}


@pytest.fixture
def scratch_url(scratch_database_url):
    return scratch_database_url


def dispose(application):
    from app.extensions import db
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


def tables(session) -> set[str]:
    return set(session.execute(text(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())


def triggers(session) -> set[tuple[str, str]]:
    return {tuple(r) for r in session.execute(text(
        "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "WHERE NOT t.tgisinternal"))}


def functions(session) -> set[str]:
    return set(session.execute(text(
        "SELECT proname FROM pg_proc WHERE proname LIKE 'fleethq_%'")).scalars())


def schema_diff(application) -> list:
    from app.extensions import db
    with application.app_context():
        with db.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True,
                                                             "compare_server_default": True})
            return compare_metadata(context, db.metadata)


# ------------------------------------------------------------------- drift


def test_models_match_migrated_schema(app):
    assert schema_diff(app) == []


def test_drift_check_sees_a_difference(app):
    """The drift test above can fail: a column added outside the migrations shows up."""
    from app.extensions import db
    with app.app_context():
        db.session.execute(text("ALTER TABLE users ADD COLUMN drift_probe integer"))
        db.session.commit()
        try:
            diff = schema_diff(app)
        finally:
            db.session.execute(text("ALTER TABLE users DROP COLUMN drift_probe"))
            db.session.commit()
            db.session.remove()
    assert any(op[0] == "remove_column" and op[3].name == "drift_probe" for op in diff), diff


# -------------------------------------------------------- downgrade/upgrade


def test_downgrade_to_base_and_upgrade_again(scratch_url):
    from flask_migrate import downgrade, upgrade

    from app.extensions import db
    application = make_app(scratch_url, check_schema=False)
    try:
        with application.app_context():
            upgrade()
            assert APP_TABLES <= tables(db.session)
            assert TRIGGERS <= triggers(db.session)
            db.session.remove()

            downgrade(revision="base")
            assert tables(db.session) <= {"alembic_version"}
            assert triggers(db.session) == set()
            assert functions(db.session) == set()
            db.session.remove()

            upgrade()
            assert APP_TABLES <= tables(db.session)
            assert TRIGGERS <= triggers(db.session)
            db.session.remove()
        assert schema_diff(application) == []
        # The re-created database is usable: the counters follow the jobs again.
        client = application.test_client()
        from tests.conftest import _make_user
        token = _make_user(application, "admin", ["admin", "worker"])
        api = Api(client, token)
        api.put_project("again")
        assert body(api.enqueue("again", values(3)))["inserted"] == 3
        assert api.counts("again")["todo"] == 3
        assert client.get("/readyz").status_code == 200
    finally:
        dispose(application)


def test_an_upgrade_interrupted_while_building_indexes_concurrently_runs_again(scratch_url):
    """A kill during 0016's CONCURRENTLY index builds leaves its first part
    committed (the autocommit block commits it), the index being built
    INVALID, the rest never built and the version at 0015. The next upgrade
    drops the INVALID index, builds all four and gets to the head."""
    from flask_migrate import downgrade, upgrade
    from sqlalchemy import text

    from app.extensions import db
    search_indexes = ("ix_jobs_value_prefix", "ix_jobs_attr", "ix_jobs_error_text", "ix_jobs_todo_tried")
    application = make_app(scratch_url, check_schema=False)
    try:
        with application.app_context():
            upgrade()
            downgrade(revision="0016")
            session = db.session
            session.execute(text("DROP INDEX ix_jobs_attr, ix_jobs_error_text, ix_jobs_todo_tried"))
            session.execute(text("UPDATE pg_index SET indisvalid = false "
                                 "WHERE indexrelid = 'ix_jobs_value_prefix'::regclass"))
            session.execute(text("UPDATE alembic_version SET version_num = '0015'"))
            session.commit()
            session.remove()

            upgrade()
            rows = session.execute(text(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = ANY(:names)"), {"names": list(search_indexes)}).all()
            assert sorted(rows) == sorted((name, True) for name in search_indexes)
            assert session.execute(text("SELECT count(*) FROM pg_index WHERE NOT indisvalid")).scalar() == 0
            session.remove()
        assert schema_diff(application) == []
    finally:
        dispose(application)


def test_upgrade_twice_is_a_no_op(app):
    from flask_migrate import upgrade

    from app.extensions import db
    with app.app_context():
        upgrade()
        assert db.session.execute(text("SELECT version_num FROM alembic_version")).scalars().all() \
            == [latest_revision()]
        db.session.remove()


# ---------------------------------------------------------- counter triggers


def _counts(session, table: str, project: str) -> dict[str, int]:
    return {state: int(total) for state, total in session.execute(text(
        f"SELECT state, sum(delta) FROM {table} WHERE project_id = :p GROUP BY state "
        "HAVING sum(delta) <> 0"), {"p": project})}


def _actual(session, project: str) -> dict[str, int]:
    return {state: n for state, n in session.execute(text(
        "SELECT state, count(*) FROM jobs WHERE project_id = :p GROUP BY state"), {"p": project})}


def _rows(session, table: str) -> int:
    return session.execute(text(f"SELECT count(*) FROM {table}")).scalar()


def test_counter_triggers_exist(app):
    from app.extensions import db
    with app.app_context():
        assert TRIGGERS <= triggers(db.session)
        assert {"fleethq_jobs_inserted", "fleethq_jobs_updated", "fleethq_jobs_deleted",
                "fleethq_attempts_inserted", "fleethq_attempts_updated"} <= functions(db.session)
        db.session.remove()


def test_counter_triggers_follow_inserts_updates_deletes(app, client, admin_token):
    from app.extensions import db
    api = Api(client, admin_token)
    api.put_project("cnt")
    api.put_project("other")
    api.enqueue("cnt", values(10))
    api.enqueue("other", values(4))
    with app.app_context():
        s = db.session
        assert _counts(s, "job_counts", "cnt") == {"todo": 10}
        # One statement moving several rows between states writes aggregated deltas.
        s.execute(text("UPDATE jobs SET state = 'done' WHERE project_id = 'cnt' AND ext_id IN ('v0', 'v1', 'v2')"))
        s.execute(text("UPDATE jobs SET state = 'failed' WHERE project_id = 'cnt' AND ext_id = 'v3'"))
        # An update that does not change the state writes nothing.
        before = _rows(s, "job_counts")
        s.execute(text("UPDATE jobs SET hops = 1 WHERE project_id = 'cnt'"))
        assert _rows(s, "job_counts") == before
        s.execute(text("DELETE FROM jobs WHERE project_id = 'cnt' AND ext_id IN ('v4', 'v0')"))
        s.commit()
        assert _counts(s, "job_counts", "cnt") == _actual(s, "cnt") == {"todo": 5, "done": 2, "failed": 1}
        assert _counts(s, "job_counts", "other") == {"todo": 4}
        db.session.remove()
    assert api.counts("cnt") == {"todo": 5, "wip": 0, "staged": 0, "done": 2, "failed": 1,
                                 "reset_exhausted": 0}


def test_attempt_totals_count_entries_into_states(app, client, admin_token):
    from app.extensions import db
    api = Api(client, admin_token)
    api.put_project("att")
    api.enqueue("att", values(5))
    jobs = body(api.claim("att", max_jobs=5))["jobs"]
    api.complete("att", jobs[:2])
    api.fail("att", jobs[2:3], retryable=False)
    with app.app_context():
        assert _counts(db.session, "attempt_totals", "att") == {"running": 5, "done": 2, "failed": 1}
        db.session.remove()


def test_fold_keeps_the_sums_and_reduces_rows(app, client, admin_token):
    from app.extensions import db
    from app.projects import counters
    api = Api(client, admin_token)
    for project in ("fa", "fb"):
        api.put_project(project)
        for i in range(5):
            api.enqueue(project, values(3, f"b{i}-"))
        jobs = body(api.claim(project, max_jobs=3))["jobs"] + body(api.claim(project, max_jobs=3))["jobs"]
        api.complete(project, jobs[:2])
        api.complete(project, jobs[2:3])
        api.fail(project, jobs[3:4], retryable=True)
        api.fail(project, jobs[4:5], retryable=True)
    # A project whose jobs are all gone.
    api.put_project("gone")
    api.enqueue("gone", values(2))
    with app.app_context():
        s = db.session
        s.execute(text("DELETE FROM jobs WHERE project_id = 'gone'"))
        s.commit()
        before = {(t, p): _counts(s, t, p) for t in ("job_counts", "attempt_totals")
                  for p in ("fa", "fb", "gone")}
        rows_before = {t: _rows(s, t) for t in ("job_counts", "attempt_totals")}
        counters.fold()
        after = {(t, p): _counts(s, t, p) for t in ("job_counts", "attempt_totals")
                 for p in ("fa", "fb", "gone")}
        assert after == before
        assert after[("job_counts", "fa")] == _actual(s, "fa") == {"todo": 11, "wip": 1, "done": 3}
        assert after[("attempt_totals", "fa")] == {"running": 6, "done": 3, "failed": 2}
        for table in ("job_counts", "attempt_totals"):
            assert _rows(s, table) < rows_before[table]
        # At most one row per (project, state) with a non-zero count remains.
        assert _rows(s, "job_counts") == s.execute(text(
            "SELECT count(*) FROM (SELECT DISTINCT project_id, state FROM jobs) x")).scalar()
        assert s.execute(text("SELECT count(*) FROM job_counts WHERE project_id = 'gone'")).scalar() == 0
        # Folding again changes nothing.
        counters.fold()
        assert {(t, p): _counts(s, t, p) for t in ("job_counts", "attempt_totals")
                for p in ("fa", "fb", "gone")} == before
        db.session.remove()
    assert api.counts("fa") == {"todo": 11, "wip": 1, "staged": 0, "done": 3, "failed": 0,
                                "reset_exhausted": 0}


def test_fold_leaves_concurrent_uncommitted_deltas_alone(app, client, admin_token, database_url):
    """A writer whose transaction is open while the fold runs keeps its delta."""
    import psycopg

    from app.extensions import db
    from app.projects import counters
    api = Api(client, admin_token)
    api.put_project("conc")
    api.enqueue("conc", values(3))
    with psycopg.connect(database_url) as other:
        other.execute("INSERT INTO jobs (project_id, ext_id, value, type, random_key) "
                      "VALUES ('conc', 'late', 'x', 'seed', 0)")
        with app.app_context():
            counters.fold()
            db.session.remove()
        other.commit()
    with app.app_context():
        assert _counts(db.session, "job_counts", "conc") == {"todo": 4}
        db.session.remove()


# --------------------------------------------------------- newer schema guard


def test_app_refuses_a_schema_newer_than_it_knows(scratch_url):
    from flask_migrate import upgrade

    from app.extensions import db
    from app.ops.schema import SchemaTooNew
    application = make_app(scratch_url, check_schema=False)
    try:
        with application.app_context():
            upgrade()
            db.session.remove()
        dispose(make_app(scratch_url))  # the current schema is fine
        with application.app_context():
            db.session.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
            db.session.commit()
            db.session.remove()
        with pytest.raises(SchemaTooNew, match="9999_future"):
            make_app(scratch_url)
        # An app started without the check still reports not ready.
        response = application.test_client().get("/readyz")
        assert response.status_code == 503
        assert response.get_json()["database"] == ["9999_future"]
    finally:
        dispose(application)


def test_app_starts_on_an_empty_database(scratch_url):
    """Before the first migration (the release step runs after the app is built)."""
    application = make_app(scratch_url)
    dispose(application)


def test_hook_completion_migration_gives_waiting_deliveries_their_outbox_row_back(scratch_url):
    """0009: a delivery that was already awaiting its callback (whose outbox
    row the old code closed on the 202) is re-driven like a new one: due one
    default completion timeout after its last change."""
    from flask_migrate import downgrade, upgrade

    from app.extensions import db
    application = make_app(scratch_url, check_schema=False)
    try:
        with application.app_context():
            upgrade()
            from app.projects import service
            service.put("hooked", {"kind": "generic"}, partial=False)
            consumer = db.session.execute(text(
                "INSERT INTO hook_consumers (project_id, name, url, secret) "
                "VALUES ('hooked', 'c', 'https://c.example.org/', 'a-secret-of-length-16') "
                "RETURNING id")).scalar()
            for attempt_id, state in ((1, "awaiting_callback"), (2, "skipped"), (3, "delivered")):
                db.session.execute(text(
                    "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key, state, "
                    "updated_at) VALUES (:c, 'hooked', :a, 'k', :s, now() - interval '10 minutes')"),
                    {"c": consumer, "a": attempt_id, "s": state})
            db.session.commit()
            db.session.remove()

            downgrade(revision="0007")
            assert db.session.execute(text(
                "SELECT state FROM hook_deliveries ORDER BY attempt_id")).scalars().all() == [
                "awaiting_callback", "failed", "delivered"]  # no skipped state before 0009
            db.session.execute(text("DELETE FROM outbox"))
            db.session.commit()
            db.session.remove()

            upgrade()
            rows = db.session.execute(text(
                "SELECT d.attempt_id, extract(epoch FROM o.due_at - d.updated_at) AS wait, "
                "d.awaiting_until = o.due_at AS same, c.completion_timeout_seconds "
                "FROM outbox o JOIN hook_deliveries d ON d.id = o.ref "
                "JOIN hook_consumers c ON c.id = d.consumer_id "
                "WHERE o.topic = 'hook_delivery' AND o.done_at IS NULL")).all()
            assert [(r[0], round(float(r[1])), r[2], r[3]) for r in rows] == [(1, 3600, True, 3600)]
            db.session.remove()
        assert schema_diff(application) == []
    finally:
        dispose(application)
