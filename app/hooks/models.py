"""Outbox rows and hook deliveries.

``outbox`` holds work that must happen after a commit (archive commits, hook
deliveries). Dramatiq messages are only hints sent after commit; the
reconciler re-sends every row that is due, so losing Redis loses nothing.
"""
from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, CheckConstraint, DateTime, ForeignKey, Index, Integer,
                        LargeBinary, String, Text, UniqueConstraint, func, text)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

OUTBOX_TOPICS = ("archive_commit", "hook_delivery", "bulk_jobs")
# pending: due to be POSTed; awaiting_callback: the consumer answered 202 and
# has not confirmed yet; delivered: done; failed: out of tries; skipped: its
# consumer was disabled on purpose (not a failure; re-enabling sends it again).
DELIVERY_STATES = ("pending", "awaiting_callback", "delivered", "failed", "skipped")
# A consumer that answers 202 has this long to call back before the delivery
# is sent again (per consumer, seconds).
COMPLETION_TIMEOUT_DEFAULT_S = 3600
COMPLETION_TIMEOUT_BOUNDS_S = (10, 7 * 24 * 3600)


class OutboxItem(db.Model):
    __tablename__ = "outbox"
    __table_args__ = (
        CheckConstraint("topic IN ('archive_commit', 'hook_delivery', 'bulk_jobs')", name="topic"),
        Index("ix_outbox_due", "due_at", postgresql_where=text("done_at IS NULL")),
        Index("uq_outbox_topic_ref", "topic", "ref", unique=True,
              postgresql_where=text("done_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    topic: Mapped[str] = mapped_column(Text, nullable=False)
    ref: Mapped[int] = mapped_column(BigInteger, nullable=False)
    due_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    tries: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    last_error = mapped_column(Text)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    done_at = mapped_column(DateTime(timezone=True))


# webhook: POST each archived asset to ``url``. derive: enqueue a job of
# ``profile`` into ``target_project_id`` (app/hooks/derived.py), no URL.
CONSUMER_KINDS = ("webhook", "derive")


class HookConsumer(db.Model):
    __tablename__ = "hook_consumers"
    __table_args__ = (
        CheckConstraint(f"completion_timeout_seconds BETWEEN {COMPLETION_TIMEOUT_BOUNDS_S[0]} "
                        f"AND {COMPLETION_TIMEOUT_BOUNDS_S[1]}", name="completion_timeout"),
        CheckConstraint("(kind = 'webhook' AND url IS NOT NULL) OR "
                        "(kind = 'derive' AND target_project_id IS NOT NULL AND profile IS NOT NULL)",
                        name="kind"),
        CheckConstraint("secret IS NOT NULL OR secret_sealed IS NOT NULL", name="secret"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("projects.id", ondelete="CASCADE"), nullable=False, index=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    kind: Mapped[str] = mapped_column(Text, nullable=False, server_default="webhook")
    url = mapped_column(Text)
    target_project_id = mapped_column(String(128), ForeignKey("projects.id", ondelete="CASCADE"))
    profile = mapped_column(JSONB)  # derive: {"name": ..., "languages": ...}
    # The signing secret, sealed under SECRET_KEY (app/sealing.py); in clear
    # only until the reconcile tick seals it (rows from before revision 0025,
    # or made by a process without a configured SECRET_KEY).
    secret_sealed = mapped_column(LargeBinary)
    secret = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="true")
    completion_timeout_seconds: Mapped[int] = mapped_column(
        Integer, nullable=False, server_default=str(COMPLETION_TIMEOUT_DEFAULT_S))
    # The backfill has queued a delivery for every asset of the project whose
    # archiving attempt id is at most this (assets.attempt_id order).
    backfilled_through: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # When it was last disabled on purpose; a re-enable rescans the assets
    # archived since then (not every asset: old delivered rows may be pruned).
    disabled_at = mapped_column(DateTime(timezone=True))
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class HookDelivery(db.Model):
    __tablename__ = "hook_deliveries"
    __table_args__ = (
        CheckConstraint("state IN ('pending', 'awaiting_callback', 'delivered', 'failed', 'skipped')",
                        name="state"),
        Index("uq_hook_deliveries_consumer_attempt", "consumer_id", "attempt_id", unique=True),
        # Failures are rare and listed newest first on the dashboard and hooks page.
        Index("ix_hook_deliveries_failed", "id", postgresql_where=text("state = 'failed'")),
        # Re-enabling a consumer sends its skipped deliveries again, a batch per tick.
        Index("ix_hook_deliveries_skipped", "consumer_id", "id",
              postgresql_where=text("state = 'skipped'")),
        # A derived job's end closes the open deliveries waiting for it.
        Index("ix_hook_deliveries_derived", "derived_job_id",
              postgresql_where=text("derived_job_id IS NOT NULL AND state IN ('pending', 'awaiting_callback')")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    consumer_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("hook_consumers.id", ondelete="CASCADE"), nullable=False)
    project_id: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    attempt_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    asset_key: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(Text, nullable=False, server_default="pending")
    tries: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    last_status = mapped_column(Integer)
    last_error = mapped_column(Text)
    callback_token_hash = mapped_column(Text)
    # After a 202: when the delivery is sent again if no callback came.
    awaiting_until = mapped_column(DateTime(timezone=True))
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    delivered_at = mapped_column(DateTime(timezone=True))
    derived_job_id = mapped_column(BigInteger)  # derive consumers: the derived_jobs row it waits for


class DerivedJob(db.Model):
    """The identity of a derived job: target project, source SHA-256 and
    profile. A re-delivered hook finds this row and enqueues nothing new."""

    __tablename__ = "derived_jobs"
    __table_args__ = (
        UniqueConstraint("target_project_id", "source_sha256", "profile", name="uq_derived_jobs_identity"),
        Index("ix_derived_jobs_job", "job_id", unique=True),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    target_project_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("projects.id", ondelete="CASCADE"), nullable=False)
    source_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    profile: Mapped[str] = mapped_column(Text, nullable=False)
    source_key: Mapped[str] = mapped_column(Text, nullable=False)   # the source asset's canonical key
    source_project_id: Mapped[str] = mapped_column(String(128), nullable=False)
    source_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    source_pages = mapped_column(Integer)
    languages: Mapped[str] = mapped_column(Text, nullable=False)
    options = mapped_column(JSONB)   # OCR options of the profile (mode, deskew, …), or null
    job_id = mapped_column(BigInteger)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
