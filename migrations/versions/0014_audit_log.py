"""audit log: who did what, in the action's own transaction

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 19:40:00.000000

One row per admin or fleet action (``app.audit``). New and empty, so its
indexes are built in the migration's transaction.
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'audit_log',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('actor', sa.Text(), nullable=False),
        sa.Column('action', sa.Text(), nullable=False),
        sa.Column('object_kind', sa.Text(), nullable=False),
        sa.Column('object_id', sa.Text(), nullable=True),
        sa.Column('details', postgresql.JSONB(astext_type=sa.Text()),
                  server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log')),
    )
    op.create_index('ix_audit_log_at', 'audit_log', ['at'])
    op.create_index('ix_audit_log_actor', 'audit_log', ['actor', 'id'])
    op.create_index('ix_audit_log_action', 'audit_log', ['action', 'id'])
    op.create_index('ix_audit_log_object', 'audit_log', ['object_kind', 'object_id', 'id'])


def downgrade():
    op.drop_table('audit_log')
