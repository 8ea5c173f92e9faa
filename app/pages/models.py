"""Tables of the pages: server-side browser sessions and the login/enrollment
rate-limit counters (migration 0003)."""
from __future__ import annotations

from sqlalchemy import DateTime, ForeignKey, Integer, String, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db


class PageSession(db.Model):
    """One signed-in browser.

    The cookie carries the session id; only its SHA-256 is stored, so a
    database dump cannot be replayed as a cookie. Deleting the row ends the
    session (logout, "sign out everywhere"); deleting the user cascades.
    """

    __tablename__ = "page_sessions"

    id_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    user_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True)
    created_at = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    # Absolute end: the cookie's lifetime slides, this does not.
    expires_at = mapped_column(DateTime(timezone=True), nullable=False)


class RateLimitWindow(db.Model):
    """A fixed-window counter: ``hits`` requests under ``key`` until ``window_end``."""

    __tablename__ = "rate_limits"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    window_end = mapped_column(DateTime(timezone=True), nullable=False)
    hits: Mapped[int] = mapped_column(Integer, nullable=False)
