"""retention: prune statistics and the indexes that keep pruning cheap

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 13:00:00.000000

The clock prunes finished rows in bounded batches (``app.ops.retention``).
``retention_stats`` keeps, per kind of row, how many were pruned in the last
run and in total, and the scan cursor of kinds that walk a table in id
order; one row per kind, written only by the prune actor, read by the
dashboard and ``/metrics`` (several processes, so the numbers live here).

Two partial indexes let a prune find its oldest finished rows without
scanning the table: done outbox rows by ``done_at`` and delivered or skipped
hook deliveries by ``updated_at``. Built CONCURRENTLY so that upgrading a
master with millions of rows does not block its writers.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

FINISHED_DELIVERIES = "state = 'delivered'"


def upgrade():
    op.create_table(
        'retention_stats',
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('pruned_total', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('last_pruned', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('last_run_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('scan_cursor', sa.BigInteger(), server_default='0', nullable=False),
        sa.PrimaryKeyConstraint('kind', name=op.f('pk_retention_stats')),
        if_not_exists=True,
    )
    with op.get_context().autocommit_block():
        op.create_index('ix_outbox_done', 'outbox', ['done_at'], unique=False,
                        postgresql_concurrently=True, if_not_exists=True, postgresql_where=sa.text('done_at IS NOT NULL'))
        op.create_index('ix_hook_deliveries_finished', 'hook_deliveries', ['updated_at'],
                        unique=False, postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text(FINISHED_DELIVERIES))


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index('ix_hook_deliveries_finished', table_name='hook_deliveries',
                      postgresql_concurrently=True)
        op.drop_index('ix_outbox_done', table_name='outbox', postgresql_concurrently=True)
    op.drop_table('retention_stats')
