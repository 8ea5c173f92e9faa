"""Running the job sweep (retries past their deadline) as the clock does."""
from __future__ import annotations


def sweep(app) -> dict:
    from app.extensions import db
    from app.projects import leasing
    with app.app_context():
        out = leasing.sweep()
        db.session.remove()
    return out
