"""task deadlines start at the first claim; max_worker_attempts is project policy

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 13:00:00.000000

A job's task deadline (``jobs.deadline_at``) used to be set at enqueue, so a
backlog expired while it waited. It is now set by the job's first claim.
Jobs that were never claimed lose the deadline their enqueue gave them; a
job that was claimed keeps its deadline (its retries count against it).

The UPDATE is one pass over the waiting (``todo``) jobs and writes a column
no index contains, so rows are rewritten in place where their page has room
(no table rewrite, no index churn). On a table with millions of waiting jobs
it takes a while: claims skip the rows it has locked (SKIP LOCKED) until it
commits, reads are not blocked, and the counter trigger sees no state change.

``ix_jobs_todo_retries`` indexes the waiting jobs that were claimed before,
so the periodic sweep (passed task deadlines, jobs tried out by their
workers) no longer reads the whole backlog every five seconds. It is built
CONCURRENTLY, after the UPDATE has committed, so claims go on meanwhile.

``projects.max_worker_attempts`` (null: no limit) replaces the constant of
three distinct workers per pdf job; a nullable column without a default is a
catalog-only change. Existing pdf projects get 3, the old constant.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('projects', sa.Column('max_worker_attempts', sa.Integer(), nullable=True), if_not_exists=True)
    op.execute("UPDATE projects SET max_worker_attempts = 3 WHERE kind = 'pdf'")
    op.execute("UPDATE jobs SET deadline_at = NULL "
               "WHERE state = 'todo' AND attempts_count = 0 AND deadline_at IS NOT NULL")
    with op.get_context().autocommit_block():
        op.create_index('ix_jobs_todo_retries', 'jobs', ['deadline_at'], unique=False,
                        postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text("state = 'todo' AND attempts_count > 0"))


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index('ix_jobs_todo_retries', table_name='jobs', postgresql_concurrently=True)
    # Waiting jobs get back the deadline the old rule gave them at enqueue.
    op.execute("""
        UPDATE jobs j SET deadline_at = j.created_at + make_interval(secs => p.task_timeout_seconds)
        FROM projects p
        WHERE p.id = j.project_id AND j.state = 'todo' AND j.attempts_count = 0
          AND j.deadline_at IS NULL AND p.task_timeout_seconds IS NOT NULL""")
    op.drop_column('projects', 'max_worker_attempts')
