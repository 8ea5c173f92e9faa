"""Running ``import-savewebhq`` in tests: scratch SavewebHQ databases (filled
by tests/savewebhq_source.py), the import run in the app, and views of what
it wrote."""
from __future__ import annotations

import os
import uuid
from datetime import datetime, UTC

import pytest
from pytest_postgresql.janitor import DatabaseJanitor

from tests.conftest import PG_HOST, PG_PORT, PG_USER
from tests.helpers import db_rows, sql
from tests.savewebhq_source import fill

TABLES = ("users", "machine_tokens", "projects", "project_dispatch", "jobs", "attempts",
          "worker_users", "worker_claim_buckets")


def _scratch():
    name = f"savewebhq_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    janitor = DatabaseJanitor(user=PG_USER, host=PG_HOST, port=PG_PORT, dbname=name)
    janitor.init()
    return janitor, f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"


@pytest.fixture(scope="module")
def source():
    """One SavewebHQ database for the module; the tests only read it."""
    janitor, url = _scratch()
    try:
        yield fill(url)
    finally:
        janitor.drop()


@pytest.fixture
def own_source():
    """A SavewebHQ database a test may change."""
    janitor, url = _scratch()
    try:
        yield fill(url, bulk_jobs=10)
    finally:
        janitor.drop()


def run(app, url, **kw):
    from app.extensions import db
    from app.imports import savewebhq
    with app.app_context():
        try:
            return savewebhq.run(url, **kw)
        finally:
            db.session.remove()


def refused(app, url, **kw):
    from app.errors import FleetError
    with pytest.raises(FleetError) as caught:
        run(app, url, **kw)
    return caught.value


def counts(app) -> dict:
    return {t: sql(app, f"SELECT count(*) FROM {t}")[0][0] for t in TABLES}


def snapshot(app) -> dict:
    """Every row the import writes, plus counters and the job-id sequence."""
    out = {t: db_rows(app, f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}
    out["job_counts"] = db_rows(app, "SELECT project_id, state, sum(delta) AS n FROM job_counts "
                                     "GROUP BY 1, 2 HAVING sum(delta) <> 0 ORDER BY 1, 2")
    out["attempt_totals"] = db_rows(app, "SELECT project_id, state, sum(delta) AS n FROM attempt_totals "
                                         "GROUP BY 1, 2 ORDER BY 1, 2")
    out["jobs_seq"] = db_rows(app, "SELECT last_value, is_called FROM jobs_id_seq")
    return out


def at(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def job(app, job_id):
    return db_rows(app, "SELECT * FROM jobs WHERE id = :i", i=job_id)[0]


def attempts(app, job_id):
    return db_rows(app, "SELECT * FROM attempts WHERE job_id = :i ORDER BY id", i=job_id)
