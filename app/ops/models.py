"""Tables of operations: prune statistics (migration 0010).

The two pruning indexes belong to tables declared elsewhere (``outbox``,
``hook_deliveries``); they are declared here, next to the code that needs
them, and attach to those tables' metadata.
"""
from __future__ import annotations

from sqlalchemy import BigInteger, DateTime, Index, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.hooks.models import HookDelivery, OutboxItem


class RetentionStat(db.Model):
    """One row per kind of pruned row: last run, totals, scan position."""

    __tablename__ = "retention_stats"

    kind: Mapped[str] = mapped_column(Text, primary_key=True)
    pruned_total: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_pruned: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_run_at = mapped_column(DateTime(timezone=True))
    # Kinds that walk a table in id order resume here on the next tick.
    scan_cursor: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")


Index("ix_outbox_done", OutboxItem.done_at, postgresql_where=text("done_at IS NOT NULL"))
Index("ix_hook_deliveries_finished", HookDelivery.updated_at,
      postgresql_where=text("state = 'delivered'"))
