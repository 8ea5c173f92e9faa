"""Running the job sweep (retries past their deadline) as the clock does, and
worker threads that must all finish."""
from __future__ import annotations

import threading


def sweep(app) -> dict:
    from app.extensions import db
    from app.projects import leasing
    with app.app_context():
        out = leasing.sweep()
        db.session.remove()
    return out


def run_threads(targets) -> None:
    """Start every target, join them all, and re-raise the first failure."""
    errors = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guard(fn), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]
