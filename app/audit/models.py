"""The audit log table (migration 0014)."""
from __future__ import annotations

from sqlalchemy import BigInteger, DateTime, Index, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db


class AuditEntry(db.Model):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    actor: Mapped[str] = mapped_column(Text, nullable=False)
    action: Mapped[str] = mapped_column(Text, nullable=False)
    object_kind: Mapped[str] = mapped_column(Text, nullable=False)
    object_id = mapped_column(Text)
    details = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    reason = mapped_column(Text)


# The page filters by actor, action or object, newest first; retention
# deletes by time. Ids follow time, so "newest first" walks the primary key.
Index("ix_audit_log_at", AuditEntry.at)
Index("ix_audit_log_actor", AuditEntry.actor, AuditEntry.id)
Index("ix_audit_log_action", AuditEntry.action, AuditEntry.id)
Index("ix_audit_log_object", AuditEntry.object_kind, AuditEntry.object_id, AuditEntry.id)
