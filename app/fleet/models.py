"""Fleet tables: enrollment credentials, enrolled nodes and token workers.

Node status: ``pending → active ⇄ draining``; ``rejected`` and ``revoked``
are terminal (DESIGN §7). Token workers (a user's machine token plus a
client-chosen worker id) are recorded on first use and can be drained or
revoked the same way.
"""
from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, CheckConstraint, DateTime, Integer, String, Text, func, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db

NODE_STATUSES = ("pending", "active", "draining", "rejected", "revoked")
TOKEN_WORKER_STATUSES = ("active", "draining", "revoked")
# first: offered every job; fallback: offered a job only once it has waited
# the project's fallback_after_seconds, or while no first-choice worker is free;
# auto (every new worker's): first or fallback by the project's lane_order
# (app.fleet.lanes.effective_tier).
TIERS = ("auto", "first", "fallback")


class EnrollmentCredential(db.Model):
    __tablename__ = "enrollment_credentials"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    created_by = mapped_column(Text)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    expires_at = mapped_column(DateTime(timezone=True), nullable=False)
    used_at = mapped_column(DateTime(timezone=True))
    node_id = mapped_column(Text)


class _Heartbeat:
    """Columns a heartbeat refreshes, shared by nodes and token workers."""
    last_heartbeat_at = mapped_column(DateTime(timezone=True))
    capacity = mapped_column(Integer)
    browser_ok = mapped_column(Boolean)
    disk_free_bytes = mapped_column(BigInteger)
    spool_bytes = mapped_column(BigInteger)
    last_error = mapped_column(Text)
    tier: Mapped[str] = mapped_column(Text, nullable=False, server_default="auto")
    # The projects its last heartbeat said it serves (NULL: an older worker
    # that does not say); a fallback worker waits only for first-choice
    # workers that serve the project.
    projects = mapped_column(ARRAY(Text))


class FleetNode(_Heartbeat, db.Model):
    __tablename__ = "fleet_nodes"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'active', 'draining', 'rejected', 'revoked')",
                        name="status"),
        CheckConstraint("tier IN ('auto', 'first', 'fallback')", name="tier"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="pending")
    secret_hash: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    enrollment_id = mapped_column(BigInteger)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    decided_at = mapped_column(DateTime(timezone=True))
    decided_by = mapped_column(Text)
    # The master's own fetcher (flask fleet local-worker): the remote switch
    # never stops it.
    local: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))


class MasterSetting(db.Model):
    """A master-wide switch every web process reads from PostgreSQL; a
    missing row means the switch's default (on)."""
    __tablename__ = "master_settings"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False)
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_by = mapped_column(Text)


class TokenWorker(_Heartbeat, db.Model):
    __tablename__ = "token_workers"
    __table_args__ = (
        CheckConstraint("status IN ('active', 'draining', 'revoked')", name="status"),
        CheckConstraint("tier IN ('auto', 'first', 'fallback')", name="tier"),
    )

    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="active")
    first_seen_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    last_seen_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
