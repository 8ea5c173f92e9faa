"""SavewebHQ import marks: a live switch that catches up

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06 15:00:00.000000

``import-savewebhq`` may run again while the old tracker still serves and
once more after it stops. Each run marks the rows it carried with a
fingerprint of the SavewebHQ row and one of FleetHQ's row as it left it; the
next run compares both to bring over what changed in SavewebHQ without
undoing what changed here (app/imports/savewebhq_marks.py). Rows imported
before this revision have no mark: a rerun adopts those that are equal.
"""
from alembic import op
import sqlalchemy as sa

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'savewebhq_marks',
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('key', sa.Text(), nullable=False),
        sa.Column('source_fp', sa.Uuid(), nullable=False),
        sa.Column('target_fp', sa.Uuid(), nullable=False),
        sa.PrimaryKeyConstraint('kind', 'key', name=op.f('pk_savewebhq_marks')))


def downgrade():
    op.drop_table('savewebhq_marks')
