from __future__ import annotations

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, LargeBinary, String, Text, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

ROLES = ("admin", "worker", "reader")
USER_STATUSES = ("active", "pending", "suspended")


class User(db.Model):
    __tablename__ = "users"
    __table_args__ = (
        CheckConstraint("status IN ('active', 'pending', 'suspended')", name="status"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="active")
    roles: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default="{}")
    github_login: Mapped[str | None] = mapped_column(Text)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class MachineToken(db.Model):
    """One live machine token per user; rotating replaces it."""

    __tablename__ = "machine_tokens"

    user_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    # SHA-256 hex of the token: the lookup key.
    token_hash: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    # The token sealed under a key derived from the application secret, so it
    # can be viewed again; NULL when tokens are configured as not viewable.
    sealed = mapped_column(LargeBinary)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    last_used_at = mapped_column(DateTime(timezone=True))


class WorkerUser(db.Model):
    """SavewebHQ's worker map: each worker id names one user (best effort,
    upserted on claims and outcomes)."""

    __tablename__ = "worker_users"

    worker_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True)
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
