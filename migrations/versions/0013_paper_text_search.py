"""full-text search of archived papers: paper_texts, paper_pages, fleethq_papers

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 16:00:00.000000

The archive actor stores each OCRed paper's plain text, one row per page
(``app.search``). ``paper_pages.tsv`` is a stored generated column over the
text search configuration ``fleethq_papers``: ``simple`` (lower-case, no
stemming, no stop words: papers are English, Polish and more, and PostgreSQL
has no Polish stemmer) with ``unaccent`` on non-ASCII words, so "lodz" finds
"Łódź". ``unaccent`` is a trusted contrib extension: a database owner
without superuser rights may create it.

The GIN index on ``tsv`` answers the searches; the btree on ``project_id``
lets the planner AND a project filter into the same bitmap. Both tables are
new and empty, so the indexes are built in the migration's transaction.
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

TSV = "to_tsvector('fleethq_papers'::regconfig, body)"


def upgrade():
    op.execute("CREATE EXTENSION IF NOT EXISTS unaccent")
    op.execute("CREATE TEXT SEARCH CONFIGURATION fleethq_papers (COPY = pg_catalog.simple)")
    op.execute("ALTER TEXT SEARCH CONFIGURATION fleethq_papers "
               "ALTER MAPPING FOR hword, hword_part, word WITH unaccent, simple")
    op.create_table(
        'paper_texts',
        sa.Column('canonical_key', sa.Text(), nullable=False),
        sa.Column('project_id', sa.String(length=128), nullable=False),
        sa.Column('derived_key', sa.Text(), nullable=True),
        sa.Column('pages', sa.Integer(), nullable=False),
        sa.Column('chars', sa.Integer(), nullable=False),
        sa.Column('languages', sa.Text(), nullable=True),
        sa.Column('indexed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
                  nullable=False),
        sa.ForeignKeyConstraint(['canonical_key'], ['assets.canonical_key'],
                                name=op.f('fk_paper_texts_canonical_key_assets'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('canonical_key', name=op.f('pk_paper_texts')),
    )
    op.create_table(
        'paper_pages',
        sa.Column('canonical_key', sa.Text(), nullable=False),
        sa.Column('page', sa.Integer(), nullable=False),
        sa.Column('project_id', sa.String(length=128), nullable=False),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('tsv', postgresql.TSVECTOR(), sa.Computed(TSV, persisted=True), nullable=False),
        sa.ForeignKeyConstraint(['canonical_key'], ['paper_texts.canonical_key'],
                                name=op.f('fk_paper_pages_canonical_key_paper_texts'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('canonical_key', 'page', name=op.f('pk_paper_pages')),
    )
    op.create_index('ix_paper_pages_tsv', 'paper_pages', ['tsv'], unique=False,
                    postgresql_using='gin')
    op.create_index('ix_paper_pages_project_id', 'paper_pages', ['project_id'], unique=False)


def downgrade():
    op.drop_index('ix_paper_pages_project_id', table_name='paper_pages')
    op.drop_index('ix_paper_pages_tsv', table_name='paper_pages')
    op.drop_table('paper_pages')
    op.drop_table('paper_texts')
    op.execute("DROP TEXT SEARCH CONFIGURATION fleethq_papers")
    op.execute("DROP EXTENSION IF EXISTS unaccent")
