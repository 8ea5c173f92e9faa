"""derived jobs: hook consumers that enqueue a job into another project

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 16:00:00.000000

A hook consumer is now of a kind: ``webhook`` (POST to its URL, as before)
or ``derive`` (enqueue a job of its ``profile`` into ``target_project_id``
in the archive commit's own transaction; no URL). ``derived_jobs`` is the
identity of such a job — target project, source SHA-256, profile — so a
re-delivered hook enqueues nothing new; a delivery points at the derived
job it waits for.

``uploads.pages`` and ``assets.pages`` keep the page count the upload check
counted (a derived job's attr carries it; a derived PDF must match it).
``assets.derived_from`` names the source asset of a derived one.
``upload_texts`` holds the plain text a worker uploaded with a derived PDF
until the archive commit indexes it.

All added columns are nullable without defaults (catalog-only changes);
existing consumers become ``webhook``.
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('hook_consumers', sa.Column('kind', sa.Text(), nullable=False, server_default='webhook'))
    op.add_column('hook_consumers', sa.Column('target_project_id', sa.String(128),
                                              sa.ForeignKey('projects.id', ondelete='CASCADE'),
                                              nullable=True))
    op.add_column('hook_consumers', sa.Column('profile', postgresql.JSONB(), nullable=True))
    op.alter_column('hook_consumers', 'url', nullable=True)
    op.create_check_constraint(op.f('ck_hook_consumers_kind'), 'hook_consumers',
                               "(kind = 'webhook' AND url IS NOT NULL) OR "
                               "(kind = 'derive' AND target_project_id IS NOT NULL AND profile IS NOT NULL)")
    op.create_table(
        'derived_jobs',
        sa.Column('id', sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column('target_project_id', sa.String(128),
                  sa.ForeignKey('projects.id', ondelete='CASCADE'), nullable=False),
        sa.Column('source_sha256', sa.Text(), nullable=False),
        sa.Column('profile', sa.Text(), nullable=False),
        sa.Column('source_key', sa.Text(), nullable=False),
        sa.Column('source_project_id', sa.String(128), nullable=False),
        sa.Column('source_size', sa.BigInteger(), nullable=False),
        sa.Column('source_pages', sa.Integer(), nullable=True),
        sa.Column('languages', sa.Text(), nullable=False),
        sa.Column('job_id', sa.BigInteger(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint('target_project_id', 'source_sha256', 'profile', name='uq_derived_jobs_identity'),
    )
    op.create_index('ix_derived_jobs_job', 'derived_jobs', ['job_id'], unique=True)
    op.add_column('hook_deliveries', sa.Column('derived_job_id', sa.BigInteger(), nullable=True))
    op.create_index('ix_hook_deliveries_derived', 'hook_deliveries', ['derived_job_id'],
                    postgresql_where=sa.text("derived_job_id IS NOT NULL AND state IN ('pending', 'awaiting_callback')"))
    op.add_column('uploads', sa.Column('pages', sa.Integer(), nullable=True))
    op.add_column('assets', sa.Column('pages', sa.Integer(), nullable=True))
    op.add_column('assets', sa.Column('derived_from', sa.Text(), nullable=True))
    op.create_table(
        'upload_texts',
        sa.Column('attempt_id', sa.BigInteger(), primary_key=True),
        sa.Column('sha256', sa.Text(), nullable=False),
        sa.Column('size', sa.BigInteger(), nullable=False),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade():
    op.drop_table('upload_texts')
    op.drop_column('assets', 'derived_from')
    op.drop_column('assets', 'pages')
    op.drop_column('uploads', 'pages')
    op.drop_index('ix_hook_deliveries_derived', table_name='hook_deliveries')
    op.drop_column('hook_deliveries', 'derived_job_id')
    op.drop_table('derived_jobs')
    op.drop_constraint(op.f('ck_hook_consumers_kind'), 'hook_consumers')
    op.execute("DELETE FROM hook_consumers WHERE kind <> 'webhook'")
    op.alter_column('hook_consumers', 'url', nullable=False)
    op.drop_column('hook_consumers', 'profile')
    op.drop_column('hook_consumers', 'target_project_id')
    op.drop_column('hook_consumers', 'kind')
