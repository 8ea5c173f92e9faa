"""page sessions (server-side, revocable) and rate-limit counters

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 09:00:00.000000

"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('page_sessions',
    sa.Column('id_hash', sa.Text(), nullable=False),
    sa.Column('user_id', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_page_sessions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id_hash', name=op.f('pk_page_sessions'))
    )
    with op.batch_alter_table('page_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_page_sessions_user_id'), ['user_id'], unique=False)

    op.create_table('rate_limits',
    sa.Column('key', sa.Text(), nullable=False),
    sa.Column('window_end', sa.DateTime(timezone=True), nullable=False),
    sa.Column('hits', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_rate_limits'))
    )


def downgrade():
    op.drop_table('rate_limits')
    with op.batch_alter_table('page_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_page_sessions_user_id'))
    op.drop_table('page_sessions')
