"""What the SavewebHQ import remembers between runs (migration 0024)."""
from __future__ import annotations

from sqlalchemy import Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import Model


class SavewebhqMark(Model):
    """One row the import carried: fingerprints of the SavewebHQ row it came
    from and of FleetHQ's row as the import left it, so that a later run can
    tell which side changed it since (app/imports/savewebhq_marks.py)."""

    __tablename__ = "savewebhq_marks"

    kind: Mapped[str] = mapped_column(Text, primary_key=True)  # users, machine_tokens, projects, jobs
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    source_fp = mapped_column(Uuid, nullable=False)
    target_fp = mapped_column(Uuid, nullable=False)
