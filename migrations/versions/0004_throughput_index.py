"""dashboard indexes: claims and completions per minute, recent errors, failed hook deliveries

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 12:00:00.000000

The dashboard aggregates attempts over a bounded time range (the last day)
with date_trunc. Without these indexes every page view would scan the whole
attempts table. Each one is narrow so the scans are index-only:

- claims: (project_id, created_at), one range scan per project;
- completions: (project_id, finished_at) only for done attempts;
- recent errors: finished_at of failed/expired attempts, a small index since
  failures are rare, read newest first;
- failed hook deliveries, newest first (also rare).

Built CONCURRENTLY so that upgrading a live master with millions of attempts
does not block claims while the indexes build.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade():
    with op.get_context().autocommit_block():
        op.create_index('ix_attempts_project_created', 'attempts', ['project_id', 'created_at'],
                        unique=False, postgresql_concurrently=True, if_not_exists=True)
        op.create_index('ix_attempts_project_done', 'attempts', ['project_id', 'finished_at'],
                        unique=False, postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text("state = 'done'"))
        op.create_index('ix_attempts_failed_finished', 'attempts', ['finished_at'],
                        unique=False, postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text("state IN ('failed', 'expired')"))
        op.create_index('ix_hook_deliveries_failed', 'hook_deliveries', ['id'], unique=False,
                        postgresql_concurrently=True, if_not_exists=True, postgresql_where=sa.text("state = 'failed'"))


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index('ix_hook_deliveries_failed', table_name='hook_deliveries',
                      postgresql_concurrently=True)
        op.drop_index('ix_attempts_failed_finished', table_name='attempts',
                      postgresql_concurrently=True)
        op.drop_index('ix_attempts_project_done', table_name='attempts',
                      postgresql_concurrently=True)
        op.drop_index('ix_attempts_project_created', table_name='attempts',
                      postgresql_concurrently=True)
