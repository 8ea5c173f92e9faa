"""documents: a project kind whose jobs are files people put in

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 22:30:00.000000

A ``documents`` project takes files (upload API, page form, consume folder,
``flask fleet documents add``). ``documents`` keeps one row per file put in,
deduplicated by its SHA-256 within the project: its name and media type, the
object key of the file as it came, the archived PDF's asset key, and the OCR
job whose text is indexed (app/documents/).
"""
from alembic import op
import sqlalchemy as sa

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade():
    op.drop_constraint(op.f('ck_projects_kind'), 'projects', type_='check')
    op.create_check_constraint(op.f('ck_projects_kind'), 'projects',
                               "kind IN ('generic', 'pdf', 'documents')")
    op.create_table(
        'documents',
        sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column('project_id', sa.String(length=128), nullable=False),
        sa.Column('sha256', sa.Text(), nullable=False),
        sa.Column('size', sa.BigInteger(), nullable=False),
        sa.Column('filename', sa.Text(), nullable=False),
        sa.Column('media_type', sa.Text(), nullable=False),
        sa.Column('original_key', sa.Text(), nullable=False),
        sa.Column('asset_key', sa.Text(), nullable=False),
        sa.Column('pdf_sha256', sa.Text(), nullable=False),
        sa.Column('pdf_size', sa.BigInteger(), nullable=False),
        sa.Column('pages', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.BigInteger(), nullable=True),
        sa.Column('added_via', sa.Text(), nullable=False),
        sa.Column('added_by', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("added_via IN ('api', 'page', 'consume', 'cli')",
                           name=op.f('ck_documents_added_via')),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_documents_project_id_projects'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_documents')),
        sa.UniqueConstraint('project_id', 'sha256', name='uq_documents_project_sha256'),
    )
    op.create_index('ix_documents_project_id', 'documents', ['project_id', 'id'])
    op.create_index('ix_documents_job', 'documents', ['job_id'])


def downgrade():
    op.drop_table('documents')
    op.execute("DELETE FROM projects WHERE kind = 'documents'")
    op.drop_constraint(op.f('ck_projects_kind'), 'projects', type_='check')
    op.create_check_constraint(op.f('ck_projects_kind'), 'projects', "kind IN ('generic', 'pdf')")
