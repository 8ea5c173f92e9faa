"""One row per document a person put into a documents project."""
from __future__ import annotations

from sqlalchemy import (BigInteger, CheckConstraint, DateTime, ForeignKey, Index, Integer, String,
                        Text, UniqueConstraint, func)
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

ADDED_VIA = ("api", "page", "consume", "cli")


class Document(db.Model):
    __tablename__ = "documents"
    __table_args__ = (
        # Deduplicated by the bytes people put in, within one project.
        UniqueConstraint("project_id", "sha256", name="uq_documents_project_sha256"),
        CheckConstraint("added_via IN ('api', 'page', 'consume', 'cli')", name="added_via"),
        Index("ix_documents_project_id", "project_id", "id"),
        Index("ix_documents_job", "job_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("projects.id", ondelete="CASCADE"), nullable=False)
    sha256: Mapped[str] = mapped_column(Text, nullable=False)        # of the file as it came
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    filename: Mapped[str] = mapped_column(Text, nullable=False)
    media_type: Mapped[str] = mapped_column(Text, nullable=False)
    original_key: Mapped[str] = mapped_column(Text, nullable=False)  # object key of the file as it came
    asset_key: Mapped[str] = mapped_column(Text, nullable=False)     # the archived PDF's canonical key
    pdf_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    pdf_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    pages: Mapped[int] = mapped_column(Integer, nullable=False)
    job_id = mapped_column(BigInteger)   # the OCR run whose text is indexed
    added_via: Mapped[str] = mapped_column(Text, nullable=False)
    added_by: Mapped[str] = mapped_column(Text, nullable=False)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
