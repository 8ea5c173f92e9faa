"""hooks: completion timeout, skipped deliveries, asset backfill

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 13:00:00.000000

- ``hook_consumers.completion_timeout_seconds`` (default 3600): a delivery
  answered 202 is sent again when no completion callback came within it;
  ``hook_consumers.backfilled_through``: the backfill's cursor over the
  project's assets (by archiving attempt id).
- ``hook_deliveries.awaiting_until`` and the ``skipped`` state (a consumer
  disabled on purpose).
- ``ix_assets_project_attempt`` for the backfill, ``ix_hook_deliveries_skipped``
  for re-enabling; both built CONCURRENTLY.
- Deliveries already ``awaiting_callback`` get their outbox row back, due one
  default completion timeout after their last change, so they are re-driven
  like new ones.

Safe on big tables: the new columns are nullable or have constant defaults
(no rewrite); the widened state check is added NOT VALID and validated
without blocking writes; the indexes are built concurrently.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

STATES = "'pending', 'awaiting_callback', 'delivered', 'failed'"


def upgrade():
    op.add_column('hook_consumers', sa.Column('completion_timeout_seconds', sa.Integer(),
                                              server_default='3600', nullable=False))
    op.add_column('hook_consumers', sa.Column('backfilled_through', sa.BigInteger(),
                                              server_default='0', nullable=False))
    op.add_column('hook_consumers', sa.Column('disabled_at', sa.DateTime(timezone=True),
                                              nullable=True))
    op.create_check_constraint(op.f('ck_hook_consumers_completion_timeout'), 'hook_consumers',
                               'completion_timeout_seconds BETWEEN 10 AND 604800')
    op.add_column('hook_deliveries', sa.Column('awaiting_until', sa.DateTime(timezone=True),
                                               nullable=True))
    op.drop_constraint(op.f('ck_hook_deliveries_state'), 'hook_deliveries', type_='check')
    op.execute(f"ALTER TABLE hook_deliveries ADD CONSTRAINT ck_hook_deliveries_state "
               f"CHECK (state IN ({STATES}, 'skipped')) NOT VALID")
    # The ALTERs above hold their lock only until here: the block commits first,
    # so the scans below run without blocking writes to hook_deliveries.
    with op.get_context().autocommit_block():
        op.execute("""
            UPDATE hook_deliveries SET awaiting_until = updated_at + interval '3600 seconds'
            WHERE state = 'awaiting_callback'""")
        op.execute("""
            INSERT INTO outbox (topic, ref, due_at)
            SELECT 'hook_delivery', id, awaiting_until FROM hook_deliveries
            WHERE state = 'awaiting_callback'
            ON CONFLICT (topic, ref) WHERE done_at IS NULL DO NOTHING""")
        op.execute("ALTER TABLE hook_deliveries VALIDATE CONSTRAINT ck_hook_deliveries_state")
        op.create_index('ix_assets_project_attempt', 'assets', ['project_id', 'attempt_id'],
                        unique=False, postgresql_concurrently=True)
        op.create_index('ix_hook_deliveries_skipped', 'hook_deliveries', ['consumer_id', 'id'],
                        unique=False, postgresql_concurrently=True,
                        postgresql_where=sa.text("state = 'skipped'"))


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index('ix_hook_deliveries_skipped', table_name='hook_deliveries',
                      postgresql_concurrently=True)
        op.drop_index('ix_assets_project_attempt', table_name='assets',
                      postgresql_concurrently=True)
    # Skipped deliveries were never sent: they count as failed in the old schema.
    op.execute("UPDATE hook_deliveries SET state = 'failed' WHERE state = 'skipped'")
    op.drop_constraint(op.f('ck_hook_deliveries_state'), 'hook_deliveries', type_='check')
    op.create_check_constraint(op.f('ck_hook_deliveries_state'), 'hook_deliveries',
                               f"state IN ({STATES})")
    op.drop_column('hook_deliveries', 'awaiting_until')
    op.drop_constraint(op.f('ck_hook_consumers_completion_timeout'), 'hook_consumers', type_='check')
    op.drop_column('hook_consumers', 'disabled_at')
    op.drop_column('hook_consumers', 'backfilled_through')
    op.drop_column('hook_consumers', 'completion_timeout_seconds')
