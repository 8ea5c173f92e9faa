"""job search and bulk actions on a filter

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 20:30:00.000000

Job search (``app/projects/job_search.py``) finds a job by id, external id,
value prefix, attribute key/value or error text in a project of millions:

- ``ix_jobs_value_prefix``: (project, first 256 characters of the value,
  id), ``text_pattern_ops`` so that ``LIKE 'prefix%'`` is a range scan;
- ``ix_jobs_attr``: GIN ``jsonb_path_ops`` over ``attr`` (``@>`` lookups),
  only for jobs that have attributes;
- ``ix_jobs_error_text``: trigram GIN over the last error's message, only
  for jobs that have one (a failed minority), so ``ILIKE '%text%'`` is an
  index search. ``pg_trgm`` is a trusted extension: a database owner
  without superuser rights may create it;
- ``ix_jobs_todo_tried``: (project, id) of queued jobs that were tried
  before (the ones that can carry an error), newest first without reading
  the untried backlog.

The indexes are built CONCURRENTLY: upgrading a live master does not block
claims while they build.

``bulk_actions`` holds an admin's requeue or delete of every job matching a
filter, worked through in bounded batches by the ``bulk_jobs`` actor with
its progress (``app/projects/bulk.py``).
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade():
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    # The bulk actor's outbox topic (its slices are re-sent like any hint).
    op.drop_constraint(op.f('ck_outbox_topic'), 'outbox', type_='check')
    op.create_check_constraint(op.f('ck_outbox_topic'), 'outbox',
                               "topic IN ('archive_commit', 'hook_delivery', 'bulk_jobs')")
    # Re-runnable: the autocommit block below commits what comes before it,
    # so an upgrade interrupted during an index build runs this part again.
    op.create_table(
        'bulk_actions',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('project_id', sa.String(length=128), nullable=False),
        sa.Column('action', sa.Text(), nullable=False),
        sa.Column('filter', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('state', sa.Text(), server_default='running', nullable=False),
        sa.Column('matched', sa.BigInteger(), nullable=False),
        sa.Column('scanned_through', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('through_job_id', sa.BigInteger(), nullable=False),
        sa.Column('processed', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('changed', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('skipped', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('created_by', sa.Text(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("action IN ('requeue', 'delete')", name=op.f('ck_bulk_actions_action')),
        sa.CheckConstraint("state IN ('running', 'done', 'cancelled')", name=op.f('ck_bulk_actions_state')),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_bulk_actions_project_id_projects'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_bulk_actions')),
        if_not_exists=True,
    )
    op.create_index('ix_bulk_actions_project', 'bulk_actions', ['project_id', 'id'], if_not_exists=True)
    with op.get_context().autocommit_block():
        op.create_index('ix_jobs_value_prefix', 'jobs',
                        ['project_id', sa.text('left(value, 256) text_pattern_ops'), 'id'],
                        postgresql_concurrently=True, if_not_exists=True)
        op.create_index('ix_jobs_attr', 'jobs', ['attr'], postgresql_using='gin',
                        postgresql_ops={'attr': 'jsonb_path_ops'}, postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text('attr IS NOT NULL'))
        op.create_index('ix_jobs_error_text', 'jobs', [sa.text("(last_error ->> 'message') gin_trgm_ops")],
                        postgresql_using='gin', postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text('last_error IS NOT NULL'))
        op.create_index('ix_jobs_todo_tried', 'jobs', ['project_id', 'id'], postgresql_concurrently=True, if_not_exists=True,
                        postgresql_where=sa.text("state = 'todo' AND attempts_count > 0"))


def downgrade():
    with op.get_context().autocommit_block():
        for name in ('ix_jobs_todo_tried', 'ix_jobs_error_text', 'ix_jobs_attr', 'ix_jobs_value_prefix'):
            op.drop_index(name, table_name='jobs', postgresql_concurrently=True)
    op.drop_table('bulk_actions')
    op.execute("DELETE FROM outbox WHERE topic = 'bulk_jobs'")
    op.drop_constraint(op.f('ck_outbox_topic'), 'outbox', type_='check')
    op.create_check_constraint(op.f('ck_outbox_topic'), 'outbox', "topic IN ('archive_commit', 'hook_delivery')")
