"""held uploads of revoked workers (DESIGN §8.7); the sealed spool file's stamp

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 14:00:00.000000

An upload whose worker is revoked before the file is archived becomes
``held``: the spool file and its quota reservation are kept for
investigation until an admin releases them. The partial index serves the
worker list's held counts and the held listing; it stays small because
held uploads are rare.

``spool_stamp`` records the sealed spool file's identity (device, inode,
size, mtime) when an upload is staged, so the archive commit can tell that
the bytes hashed while streaming are still the file's without reading them
again.
"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

OLD_STATES = "state IN ('uploading', 'staged', 'done', 'failed', 'expired')"
NEW_STATES = "state IN ('uploading', 'staged', 'done', 'failed', 'expired', 'held')"


def upgrade():
    op.add_column('uploads', sa.Column('held_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('uploads', sa.Column('spool_stamp', sa.Text(), nullable=True))
    op.drop_constraint(op.f('ck_uploads_state'), 'uploads', type_='check')
    op.create_check_constraint(op.f('ck_uploads_state'), 'uploads', sa.text(NEW_STATES))
    op.create_index('ix_uploads_held', 'uploads', ['worker_id', 'worker_owner'], unique=False,
                    postgresql_where=sa.text("state = 'held'"))


def downgrade():
    # Held uploads cannot be represented before this revision: they become
    # failed and give back their quota; the older sweeper then removes their
    # files as orphans.
    op.execute("UPDATE spool_usage SET reserved_bytes = GREATEST(0, reserved_bytes - "
               "(SELECT COALESCE(sum(reserved_bytes), 0) FROM uploads WHERE state = 'held'))")
    op.execute("UPDATE uploads SET state = 'failed' WHERE state = 'held'")
    op.drop_index('ix_uploads_held', table_name='uploads', postgresql_where=sa.text("state = 'held'"))
    op.drop_constraint(op.f('ck_uploads_state'), 'uploads', type_='check')
    op.create_check_constraint(op.f('ck_uploads_state'), 'uploads', sa.text(OLD_STATES))
    op.drop_column('uploads', 'spool_stamp')
    op.drop_column('uploads', 'held_at')
