"""a host that sleeps: paused task budgets, the projects a worker serves

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 22:45:00.000000

- ``jobs.work_left_s``: what was left of a job's task budget when its lease
  ran out (its worker went away); no deadline runs while it waits, and its
  next claim starts one from this (app/projects/states.py);
- ``fleet_nodes.projects``, ``token_workers.projects``: the projects a
  worker's last heartbeat said it serves (NULL for a worker that does not
  say), so a fallback worker waits only for first-choice workers that serve
  the project (app/fleet/lanes.py).
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('jobs', sa.Column('work_left_s', sa.Double(), nullable=True))
    for table in ('fleet_nodes', 'token_workers'):
        op.add_column(table, sa.Column('projects', postgresql.ARRAY(sa.Text()), nullable=True))


def downgrade():
    for table in ('fleet_nodes', 'token_workers'):
        op.drop_column(table, 'projects')
    op.drop_column('jobs', 'work_left_s')
