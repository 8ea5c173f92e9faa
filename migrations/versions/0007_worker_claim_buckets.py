"""per-worker claim audit buckets (SavewebHQ's tracker_worker_claim_buckets)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 11:30:00.000000

For projects with ``worker_claim_qps`` set, every claim adds to one row per
project, worker and minute: how many claims it sent, how many jobs they got,
and the policy version the worker reported. Operators compare
``claim_requests / 60.0`` with the policy. Old rows are pruned after
``CLAIM_BUCKET_RETENTION_DAYS``.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'worker_claim_buckets',
        sa.Column('project_id', sa.String(length=128), nullable=False),
        sa.Column('worker_id', sa.String(length=128), nullable=False),
        sa.Column('bucket_started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('claim_requests', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('jobs_dispatched', sa.BigInteger(), server_default='0', nullable=False),
        sa.Column('policy_version', sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id'],
                                name=op.f('fk_worker_claim_buckets_project_id_projects'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('project_id', 'worker_id', 'bucket_started_at',
                                name=op.f('pk_worker_claim_buckets')),
    )
    op.create_index('ix_worker_claim_buckets_project_time', 'worker_claim_buckets',
                    ['project_id', sa.text('bucket_started_at DESC')], unique=False)
    op.create_index('ix_worker_claim_buckets_time', 'worker_claim_buckets',
                    ['bucket_started_at'], unique=False)


def downgrade():
    op.drop_index('ix_worker_claim_buckets_time', table_name='worker_claim_buckets')
    op.drop_index('ix_worker_claim_buckets_project_time', table_name='worker_claim_buckets')
    op.drop_table('worker_claim_buckets')
