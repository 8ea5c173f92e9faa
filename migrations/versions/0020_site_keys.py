"""Site keys on jobs

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 07:00:00.000000

``jobs.site_key``: the publisher a job's fetch reaches (a DOI prefix, a
registrable domain, ``arxiv.org`` or a key the job names), set at enqueue by
app.sites.keys. Jobs enqueued before this revision have none until
``flask --app wsgi fleet sites rekey`` gives them one. The index serves the
job search's site filter; built CONCURRENTLY so that upgrading a live master
with millions of jobs does not block its writers.
"""
from alembic import op
import sqlalchemy as sa

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('jobs', sa.Column('site_key', sa.Text(), nullable=True), if_not_exists=True)
    with op.get_context().autocommit_block():
        op.create_index('ix_jobs_site', 'jobs', ['project_id', 'site_key', 'id'], unique=False,
                        postgresql_concurrently=True, if_not_exists=True, postgresql_where=sa.text('site_key IS NOT NULL'))


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index('ix_jobs_site', table_name='jobs', postgresql_concurrently=True)
    op.drop_column('jobs', 'site_key')
