"""worker tiers, the local lane, the master-wide remote switch, fallback wait

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 13:00:00.000000

Every fleet node and token worker gets a ``tier`` ('first' or 'fallback');
nodes get ``local`` (the master's own fetcher, which the remote switch never
stops); projects get ``fallback_after_seconds`` (how long a claimable job
waits before a fallback worker may take it); ``master_settings`` holds
master-wide switches that every web process must agree on (``remote``).

Safe on big tables: each new column has a constant default (a catalog-only
change since PostgreSQL 11, no rewrite), and the tier checks are added NOT
VALID, then validated without blocking writes.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade():
    for table in ('fleet_nodes', 'token_workers'):
        op.add_column(table, sa.Column('tier', sa.Text(), server_default='first', nullable=False))
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_tier "
                   "CHECK (tier IN ('first', 'fallback')) NOT VALID")
        op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT ck_{table}_tier")
    op.add_column('fleet_nodes', sa.Column('local', sa.Boolean(), server_default=sa.text('false'),
                                           nullable=False))
    op.add_column('projects', sa.Column('fallback_after_seconds', sa.Integer(),
                                        server_default='60', nullable=False))
    op.create_table(
        'master_settings',
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('enabled', sa.Boolean(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.Column('updated_by', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_master_settings')),
    )


def downgrade():
    op.drop_table('master_settings')
    op.drop_column('projects', 'fallback_after_seconds')
    op.drop_column('fleet_nodes', 'local')
    for table in ('fleet_nodes', 'token_workers'):
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_tier")
        op.drop_column(table, 'tier')
