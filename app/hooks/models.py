"""Outbox rows and hook deliveries.

``outbox`` holds work that must happen after a commit (archive commits, hook
deliveries). Dramatiq messages are only hints sent after commit; the
reconciler re-sends every row that is due, so losing Redis loses nothing.
"""
from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, CheckConstraint, DateTime, ForeignKey, Index, Integer,
                        String, Text, func, text)
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

OUTBOX_TOPICS = ("archive_commit", "hook_delivery")
DELIVERY_STATES = ("pending", "awaiting_callback", "delivered", "failed")


class OutboxItem(db.Model):
    __tablename__ = "outbox"
    __table_args__ = (
        CheckConstraint("topic IN ('archive_commit', 'hook_delivery')", name="topic"),
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


class HookConsumer(db.Model):
    __tablename__ = "hook_consumers"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("projects.id", ondelete="CASCADE"), nullable=False, index=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    secret: Mapped[str] = mapped_column(Text, nullable=False)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default="true")
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class HookDelivery(db.Model):
    __tablename__ = "hook_deliveries"
    __table_args__ = (
        CheckConstraint("state IN ('pending', 'awaiting_callback', 'delivered', 'failed')",
                        name="state"),
        Index("uq_hook_deliveries_consumer_attempt", "consumer_id", "attempt_id", unique=True),
        # Failures are rare and listed newest first on the dashboard and hooks page.
        Index("ix_hook_deliveries_failed", "id", postgresql_where=text("state = 'failed'")),
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
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    delivered_at = mapped_column(DateTime(timezone=True))
