"""worker activity index: each worker's finished attempts by time

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 20:00:00.000000

The worker page lists a worker's last 100 finished attempts and the workers
list counts each worker's done, failed and bytes of the last hour and day:
one range scan of (worker_id, owner, finished_at) per worker instead of a
scan of every attempt. Built CONCURRENTLY so that upgrading a live master
with millions of attempts does not block claims while it builds.
"""
from alembic import op
import sqlalchemy as sa

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade():
    with op.get_context().autocommit_block():
        op.create_index('ix_attempts_worker_finished', 'attempts',
                        ['worker_id', sa.text("COALESCE(worker_owner, '')"), 'finished_at'],
                        unique=False, postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text("finished_at IS NOT NULL"))


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index('ix_attempts_worker_finished', table_name='attempts',
                      postgresql_concurrently=True)
