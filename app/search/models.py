"""The full-text index of archived papers: one row per paper, one per page.

``paper_texts`` says a paper (an asset) has been indexed: its page count, its
size in characters, the OCR output asset it came from and the languages the
OCR saw. ``paper_pages`` holds each page's plain text and its ``tsvector``,
so a hit can say "page N" and a snippet is built from one page, never from a
whole book. Pages belong to their paper row (cascade) and the paper row to
its asset (cascade): deleting an asset forgets its text.

``tsv`` is a stored generated column, so every writer (the archive actor's
COPY, a backfill, psql) indexes text the same way. Its configuration,
``fleethq_papers``, is PostgreSQL's ``simple`` (lower-case, no stemming, no
stop words) with ``unaccent`` on non-ASCII words: papers are English,
Polish and more, PostgreSQL has no Polish stemmer, and a stemmer for one
language mangles the others. Without stemming "cat" does not find "cats",
but every language is searched the same way, and "lodz" finds "Łódź".
``project_id`` is copied onto each page so a project filter is an index
condition (bitmap-AND with the GIN index), not a join.
"""
from __future__ import annotations

from sqlalchemy import Computed, DateTime, ForeignKey, Index, Integer, String, Text, func
from sqlalchemy.dialects.postgresql import TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

# The text search configuration (created by migration 0013).
TS_CONFIG = "fleethq_papers"
TSV_EXPRESSION = f"to_tsvector('{TS_CONFIG}'::regconfig, body)"


class PaperText(db.Model):
    __tablename__ = "paper_texts"

    canonical_key: Mapped[str] = mapped_column(
        Text, ForeignKey("assets.canonical_key", ondelete="CASCADE"), primary_key=True)
    project_id: Mapped[str] = mapped_column(String(128), nullable=False)
    # The canonical key of the OCR output asset this text was read from.
    derived_key = mapped_column(Text)
    pages: Mapped[int] = mapped_column(Integer, nullable=False)
    chars: Mapped[int] = mapped_column(Integer, nullable=False)
    languages = mapped_column(Text)
    indexed_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class PaperPage(db.Model):
    __tablename__ = "paper_pages"
    __table_args__ = (
        Index("ix_paper_pages_tsv", "tsv", postgresql_using="gin"),
        Index("ix_paper_pages_project_id", "project_id"),
    )

    canonical_key: Mapped[str] = mapped_column(
        Text, ForeignKey("paper_texts.canonical_key", ondelete="CASCADE"), primary_key=True)
    page: Mapped[int] = mapped_column(Integer, primary_key=True)  # 1-based
    project_id: Mapped[str] = mapped_column(String(128), nullable=False)
    body: Mapped[str] = mapped_column(Text, nullable=False)
    tsv = mapped_column(TSVECTOR, Computed(TSV_EXPRESSION, persisted=True), nullable=False)
