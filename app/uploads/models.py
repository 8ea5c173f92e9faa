"""Upload rows double as receipts (DESIGN §7, §8).

One row per attempt that started an upload. ``state`` moves
``uploading → staged → done`` (or ``failed`` / ``expired``; ``held`` when the
worker was revoked before the file was archived: the file is kept until an
admin releases it, then ``failed``); ``generation``
fences abandoned transfers: only the newest generation may stage.
``spool_usage`` is a single row whose lock serializes quota reservations.
"""
from __future__ import annotations

from sqlalchemy import (BigInteger, CheckConstraint, DateTime, Index, Integer, String, Text, func,
                        text)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

UPLOAD_STATES = ("uploading", "staged", "done", "failed", "expired", "held")


class Upload(db.Model):
    __tablename__ = "uploads"
    __table_args__ = (
        CheckConstraint("state IN ('uploading', 'staged', 'done', 'failed', 'expired', 'held')",
                        name="state"),
        Index("ix_uploads_live", "state", "updated_at",
              postgresql_where=text("state IN ('uploading', 'staged')")),
        Index("ix_uploads_held", "worker_id", "worker_owner", postgresql_where=text("state = 'held'")),
    )

    attempt_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, nullable=False, index=True)
    project_id: Mapped[str] = mapped_column(String(128), nullable=False)
    worker_id: Mapped[str] = mapped_column(Text, nullable=False)
    worker_owner = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text, nullable=False, server_default="uploading")
    sha256: Mapped[str] = mapped_column(Text, nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    generation: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    reserved_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    spool_file = mapped_column(Text)
    spool_stamp = mapped_column(Text)  # spool.stamp() of the sealed file, set when staged
    upload_deadline_at = mapped_column(DateTime(timezone=True))
    canonical_key = mapped_column(Text)
    asset_key = mapped_column(Text)
    error = mapped_column(JSONB)
    source_url = mapped_column(Text)
    download_strategy = mapped_column(Text)
    download_result = mapped_column(JSONB)
    pages = mapped_column(Integer)  # counted by the upload check
    commit_tries: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    staged_at = mapped_column(DateTime(timezone=True))
    done_at = mapped_column(DateTime(timezone=True))
    held_at = mapped_column(DateTime(timezone=True))


class SpoolUsage(db.Model):
    __tablename__ = "spool_usage"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reserved_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")


class Asset(db.Model):
    """A registered archived file. An existing asset keeps its own hash and size."""

    __tablename__ = "assets"
    # The hook backfill walks a project's assets in attempt order.
    __table_args__ = (Index("ix_assets_project_attempt", "project_id", "attempt_id"),)

    canonical_key: Mapped[str] = mapped_column(Text, primary_key=True)
    sha256: Mapped[str] = mapped_column(Text, nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    object_key: Mapped[str] = mapped_column(Text, nullable=False)
    project_id: Mapped[str] = mapped_column(String(128), nullable=False)
    job_id = mapped_column(BigInteger)
    attempt_id = mapped_column(BigInteger)
    pages = mapped_column(Integer)
    derived_from = mapped_column(Text)  # a derived asset (OCR output): its source's canonical key
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class UploadText(db.Model):
    """The plain text a worker uploaded beside a derived PDF, until the
    archive commit indexes it (then the row goes)."""

    __tablename__ = "upload_texts"

    attempt_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    sha256: Mapped[str] = mapped_column(Text, nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    body: Mapped[str] = mapped_column(Text, nullable=False)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
