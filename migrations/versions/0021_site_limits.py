"""Site limits, site groups and site pauses

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 08:00:00.000000

The fleet's politeness towards each publisher (app/sites, docs/politeness.md):

- ``site_groups``: a key that belongs to a named site (several domains and
  DOI prefixes, one publisher); a key is in at most one group.
- ``site_limits``: at most N attempts in flight and R starts per second for
  a site (a key or a group), fleet-wide (``project_id`` NULL) or for one
  project's jobs (an override that replaces the fleet-wide rule there). The
  start bucket's state lives on the rule's row, which every claim that may
  take the site's jobs locks: that lock is what makes the limit hold under
  any interleaving of claims.
- ``site_pauses``: a site no worker may start until ``until``.

``ix_jobs_live_site`` counts a site's attempts in flight (its jobs ``wip``:
a staged upload no longer reaches the publisher); it holds only those, so it
stays small whatever the backlog.
"""
from alembic import op
import sqlalchemy as sa

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'site_groups',
        sa.Column('site_key', sa.Text(), primary_key=True),
        sa.Column('site', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        if_not_exists=True,
    )
    op.create_index('ix_site_groups_site', 'site_groups', ['site'], if_not_exists=True)
    op.create_table(
        'site_limits',
        sa.Column('id', sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column('site', sa.Text(), nullable=False),
        sa.Column('project_id', sa.String(128), sa.ForeignKey('projects.id', ondelete='CASCADE'), nullable=True),
        sa.Column('max_in_flight', sa.Integer(), nullable=True),
        sa.Column('max_starts_per_s', sa.Double(), nullable=True),
        sa.Column('tokens', sa.Double(), server_default='0', nullable=False),
        sa.Column('refilled_at', sa.DateTime(timezone=True),
                  server_default=sa.text("'1970-01-01 00:00:00+00'"), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint('max_in_flight IS NULL OR max_in_flight >= 0', name='max_in_flight'),
        sa.CheckConstraint('max_starts_per_s IS NULL OR max_starts_per_s > 0', name='max_starts_per_s'),
        if_not_exists=True,
    )
    op.create_index('uq_site_limits_scope', 'site_limits',
                    ['site', sa.text("COALESCE(project_id, '')")], unique=True, if_not_exists=True)
    op.create_table(
        'site_pauses',
        sa.Column('site', sa.Text(), primary_key=True),
        sa.Column('until', sa.DateTime(timezone=True), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('source', sa.Text(), nullable=False),
        sa.Column('strikes', sa.Integer(), server_default='1', nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        if_not_exists=True,
    )
    with op.get_context().autocommit_block():
        op.create_index('ix_jobs_live_site', 'jobs', ['site_key', 'project_id'], unique=False,
                        postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text("state = 'wip' AND site_key IS NOT NULL"))


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index('ix_jobs_live_site', table_name='jobs', postgresql_concurrently=True)
    op.drop_table('site_pauses')
    op.drop_index('uq_site_limits_scope', table_name='site_limits')
    op.drop_table('site_limits')
    op.drop_index('ix_site_groups_site', table_name='site_groups')
    op.drop_table('site_groups')
