"""Projects' share weights

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 09:20:00.000000

``projects.share_weight``: a worker that serves several projects takes jobs
from them in proportion to their weights (the heartbeat answer carries them;
``workers/runner/shares.py`` applies them). A FleetHQ policy field, never on
SavewebHQ's routes; 1 for every project so far (equal shares).
"""
from alembic import op
import sqlalchemy as sa

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('projects', sa.Column('share_weight', sa.Integer(), server_default='1', nullable=False))
    op.create_check_constraint(op.f('ck_projects_share_weight'), 'projects', 'share_weight BETWEEN 1 AND 1000')


def downgrade():
    op.drop_constraint(op.f('ck_projects_share_weight'), 'projects', type_='check')
    op.drop_column('projects', 'share_weight')
