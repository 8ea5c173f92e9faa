"""A job's project checked once per statement, not once per row

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 02:30:00.000000

The foreign key from jobs.project_id to projects checked every inserted row
on its own (a look-up and a lock of the project row per job): about a quarter
of PostgreSQL's work for a 1,000-job enqueue. The same rule is now kept per
statement: the counter trigger that already runs once per INSERT locks the
batch's projects (FOR KEY SHARE, as the foreign key did) and refuses the
statement if one is missing, with the foreign key's own error code; a job's
project_id cannot change; deleting a project deletes its jobs first (the
cascade). The lock is what keeps a concurrent delete out: a delete waits for
an inserting transaction that holds it, then deletes what that one committed;
an insert that comes after a delete finds no project row to lock.
"""
from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

_COUNTING = """
        INSERT INTO job_counts (project_id, state, delta)
        SELECT project_id, state, count(*) FROM new_rows GROUP BY project_id, state;
        RETURN NULL;
    END $$
"""

CHECKED_INSERT = """
    CREATE OR REPLACE FUNCTION fleethq_jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        missing text;
    BEGIN
        SELECT n.project_id INTO missing
        FROM (SELECT DISTINCT project_id FROM new_rows) n
        LEFT JOIN (SELECT id FROM projects WHERE id IN (SELECT project_id FROM new_rows) FOR KEY SHARE) p
            ON p.id = n.project_id
        WHERE p.id IS NULL LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'insert on table "jobs" names project %, which does not exist', missing
                USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs', COLUMN = 'project_id';
        END IF;
""" + _COUNTING

PLAIN_INSERT = """
    CREATE OR REPLACE FUNCTION fleethq_jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
""" + _COUNTING

UPGRADE = [
    CHECKED_INSERT,
    """
    CREATE FUNCTION fleethq_job_project_kept() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'a job''s project cannot change (job %)', OLD.id
            USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs', COLUMN = 'project_id';
    END $$
    """,
    "CREATE TRIGGER jobs_project_kept BEFORE UPDATE OF project_id ON jobs FOR EACH ROW "
    "WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id) EXECUTE FUNCTION fleethq_job_project_kept()",
    """
    CREATE FUNCTION fleethq_project_jobs_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM jobs WHERE project_id = OLD.id;
        RETURN OLD;
    END $$
    """,
    "CREATE TRIGGER projects_delete_jobs BEFORE DELETE ON projects FOR EACH ROW "
    "EXECUTE FUNCTION fleethq_project_jobs_deleted()",
    "ALTER TABLE jobs DROP CONSTRAINT fk_jobs_project_id_projects",
]

DOWNGRADE = [
    "ALTER TABLE jobs ADD CONSTRAINT fk_jobs_project_id_projects FOREIGN KEY (project_id) "
    "REFERENCES projects (id) ON DELETE CASCADE",
    "DROP TRIGGER projects_delete_jobs ON projects",
    "DROP FUNCTION fleethq_project_jobs_deleted()",
    "DROP TRIGGER jobs_project_kept ON jobs",
    "DROP FUNCTION fleethq_job_project_kept()",
    PLAIN_INSERT,
]


def upgrade():
    for statement in UPGRADE:
        op.execute(statement)


def downgrade():
    for statement in DOWNGRADE:
        op.execute(statement)
