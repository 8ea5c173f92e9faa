"""Tables of the fleet's politeness towards sites (migration 0021)."""
from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, DateTime, Double, ForeignKey, Identity, Index, Integer, \
    String, Text, func, text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import Model


class SiteGroup(Model):
    """A key that belongs to a named site: several domains and DOI prefixes,
    one publisher. The key is the primary key: it is in one group at most."""

    __tablename__ = "site_groups"
    __table_args__ = (Index("ix_site_groups_site", "site"),)

    site_key: Mapped[str] = mapped_column(Text, primary_key=True)
    site: Mapped[str] = mapped_column(Text, nullable=False)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class SiteLimit(Model):
    """At most ``max_in_flight`` attempts in flight and ``max_starts_per_s``
    starts for a site, fleet-wide (no project) or for one project's jobs.
    The start bucket's state is here: claims lock the row (app.sites.gate)."""

    __tablename__ = "site_limits"
    __table_args__ = (
        CheckConstraint("max_in_flight IS NULL OR max_in_flight >= 0", name="max_in_flight"),
        CheckConstraint("max_starts_per_s IS NULL OR max_starts_per_s > 0", name="max_starts_per_s"),
        Index("uq_site_limits_scope", "site", text("COALESCE(project_id, '')"), unique=True),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    site: Mapped[str] = mapped_column(Text, nullable=False)
    project_id = mapped_column(String(128), ForeignKey("projects.id", ondelete="CASCADE"))
    max_in_flight = mapped_column(Integer)
    max_starts_per_s = mapped_column(Double)
    tokens = mapped_column(Double, nullable=False, server_default="0")
    refilled_at = mapped_column(DateTime(timezone=True), nullable=False,
                                server_default=text("'1970-01-01 00:00:00+00'"))
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class SitePause(Model):
    """No worker starts a job of this site before ``until``."""

    __tablename__ = "site_pauses"

    site: Mapped[str] = mapped_column(Text, primary_key=True)
    until = mapped_column(DateTime(timezone=True), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    source: Mapped[str] = mapped_column(Text, nullable=False)      # "operator" or the reporting worker
    strikes: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
