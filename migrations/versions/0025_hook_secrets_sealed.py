"""Hook signing secrets sealed at rest

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06 20:00:00.000000

A consumer's signing secret is kept sealed under the application's secret
key (app/sealing.py), as viewable machine tokens are. Secrets stored in clear
before this revision stay readable; the tasks process's reconcile tick seals
them once it runs with a configured SECRET_KEY (app/hooks/consumers.py).
"""
from alembic import op
import sqlalchemy as sa

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('hook_consumers', sa.Column('secret_sealed', sa.LargeBinary(), nullable=True))
    op.alter_column('hook_consumers', 'secret', existing_type=sa.Text(), nullable=True)
    op.create_check_constraint(op.f('ck_hook_consumers_secret'), 'hook_consumers',
                               'secret IS NOT NULL OR secret_sealed IS NOT NULL')


def downgrade():
    # Sealed secrets cannot be written back in clear without the key: refuse
    # rather than leave consumers that can no longer sign.
    bind = op.get_bind()
    sealed = bind.execute(sa.text("SELECT count(*) FROM hook_consumers WHERE secret IS NULL")).scalar()
    if sealed:
        raise RuntimeError(f"{sealed} hook consumers have sealed secrets only; delete them or "
                           "stay at revision 0025")
    op.drop_constraint(op.f('ck_hook_consumers_secret'), 'hook_consumers', type_='check')
    op.alter_column('hook_consumers', 'secret', existing_type=sa.Text(), nullable=False)
    op.drop_column('hook_consumers', 'secret_sealed')
