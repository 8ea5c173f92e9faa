"""Driving the spool sweeper and ageing spool files."""
from __future__ import annotations

import os
import time


def sweep(app, now: float | None = None) -> dict:
    from app.extensions import db
    from app.uploads import sweeper
    with app.app_context():
        try:
            return sweeper.sweep(app.config, now=now)
        finally:
            db.session.remove()


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))
