"""The insert trigger reads a statement's new jobs once

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 04:20:00.000000

fleethq_jobs_inserted (0026) read the statement's new rows three times: the
distinct projects, the projects to lock, the counts. It now groups them once
into (project, state, count) and does the rest on those few rows: lock the
projects FOR KEY SHARE, add the counts of the projects it locked, refuse the
statement if a project is missing (the foreign key's error code, as before).
Measured by bench/enqueue_costs.py's method (1,000-job enqueues, alternating
copies of one database, 230 each): PostgreSQL CPU per 1,000 jobs 17.7 ms with
three passes, 16.7 with one, 16.2 with no insert trigger at all.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None

ONE_PASS = """
    CREATE OR REPLACE FUNCTION fleethq_jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        missing text;
    BEGIN
        WITH counted AS MATERIALIZED (
            SELECT project_id, state, count(*) AS n FROM new_rows GROUP BY project_id, state
        ), locked AS MATERIALIZED (
            SELECT id FROM projects WHERE id IN (SELECT project_id FROM counted) FOR KEY SHARE
        ), added AS (
            INSERT INTO job_counts (project_id, state, delta)
            SELECT c.project_id, c.state, c.n FROM counted c JOIN locked l ON l.id = c.project_id
        )
        SELECT c.project_id INTO missing FROM counted c
        WHERE c.project_id NOT IN (SELECT id FROM locked) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'insert on table "jobs" names project %, which does not exist', missing
                USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs', COLUMN = 'project_id';
        END IF;
        RETURN NULL;
    END $$
"""


def _revision_0026():
    """0026's module (its file name is not an importable name): the
    downgrade puts back its function as it was."""
    path = Path(__file__).with_name("0026_jobs_project_checked_per_statement.py")
    spec = importlib.util.spec_from_file_location("fleethq_migration_0026", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade():
    op.execute(ONE_PASS)


def downgrade():
    op.execute(_revision_0026().CHECKED_INSERT)
