"""OCR profile options on derived jobs

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 23:30:00.000000

``derived_jobs.options``: what an OCR profile asks beyond its languages
(mode skip-text / redo / force, deskew, rotate, clean, optimize), handed to
the OCR worker with the job's source (app/hooks/derived.py).
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('derived_jobs', sa.Column('options', postgresql.JSONB(astext_type=sa.Text()),
                                            nullable=True))


def downgrade():
    op.drop_column('derived_jobs', 'options')
