"""SavewebHQ drop-in: viewable machine tokens, imported attempt ids, the worker map

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:00:00.000000

``machine_tokens.sealed`` holds the token sealed (authenticated encryption)
under a key derived from the application secret, so an admin or the worker
can view it again while a database dump alone reveals nothing; it is NULL
when tokens are configured as not viewable.

``attempts.wire_id`` is the attempt id a worker holds when it is not the
attempt's own number: attempts imported from a SavewebHQ database keep the
``at_…`` ids their workers already hold, so those workers can still
complete them.

``worker_users`` is SavewebHQ's worker map: each worker id names one user,
upserted on every claim and outcome; it disappears with the user.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('machine_tokens', sa.Column('sealed', sa.LargeBinary(), nullable=True))
    op.add_column('attempts', sa.Column('wire_id', sa.Text(), nullable=True))
    op.create_index('uq_attempts_wire_id', 'attempts', ['job_id', 'wire_id'], unique=True,
                    postgresql_where=sa.text('wire_id IS NOT NULL'))
    op.create_table(
        'worker_users',
        sa.Column('worker_id', sa.String(length=128), nullable=False),
        sa.Column('user_id', sa.String(length=128), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_worker_users_user_id_users'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('worker_id', name=op.f('pk_worker_users')),
    )
    op.create_index('ix_worker_users_user_id', 'worker_users', ['user_id'], unique=False)


def downgrade():
    op.drop_index('ix_worker_users_user_id', table_name='worker_users')
    op.drop_table('worker_users')
    op.drop_index('uq_attempts_wire_id', table_name='attempts',
                  postgresql_where=sa.text('wire_id IS NOT NULL'))
    op.drop_column('attempts', 'wire_id')
    op.drop_column('machine_tokens', 'sealed')
