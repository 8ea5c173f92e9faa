"""Lane order as project policy

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 10:00:00.000000

A worker's tier may now be ``auto`` (the default of every new node and
token worker): first choice or fallback by the project's ``lane_order``.
``local_first`` (pdf's default, the download fleet's seed): the master's own
fetcher first, remote workers for what it cannot take; ``remote_first``
(documents and generic): remote workers first, the local lane as fallback.
A tier an admin sets (``first``/``fallback``) still wins.

Workers that were ``first`` (the old default, whether or not anyone chose
it) become ``auto``: a pdf project's remote nodes are then fallback behind
the local fetcher, as the seed has it; ``fallback`` stays (only an admin or
``local-worker --tier`` set it).
"""
from alembic import op
import sqlalchemy as sa

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

TABLES = ('fleet_nodes', 'token_workers')


def upgrade():
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_tier")
        op.execute(f"UPDATE {table} SET tier = 'auto' WHERE tier = 'first'")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_tier "
                   "CHECK (tier IN ('auto', 'first', 'fallback'))")
        op.alter_column(table, 'tier', server_default='auto')
    op.add_column('projects', sa.Column('lane_order', sa.Text(), server_default='remote_first',
                                        nullable=False))
    op.execute("UPDATE projects SET lane_order = 'local_first' WHERE kind = 'pdf'")
    op.create_check_constraint(op.f('ck_projects_lane_order'), 'projects',
                               "lane_order IN ('local_first', 'remote_first')")


def downgrade():
    op.drop_constraint(op.f('ck_projects_lane_order'), 'projects', type_='check')
    op.drop_column('projects', 'lane_order')
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_tier")
        op.execute(f"UPDATE {table} SET tier = 'first' WHERE tier = 'auto'")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_tier "
                   "CHECK (tier IN ('first', 'fallback'))")
        op.alter_column(table, 'tier', server_default='first')
