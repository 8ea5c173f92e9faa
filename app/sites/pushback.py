"""A site that pushed back pauses for the whole fleet (issue "Polite at fleet
scale" §3; the codes are workers.wire.failures).

The pause lasts what the site asked (``Retry-After``), at least
``BASE_PAUSE_S`` doubled for each repeat (a *strike*), at most
``MAX_PAUSE_S``. A repeat is a pushback after the last pause ended, within
``STRIKE_MEMORY_S`` of it; reports that arrive while the site is paused come
from attempts started before the pause and add no strike (forty workers
throttled at once are one event, not forty). An operator's longer pause is
never shortened. The pause is on the job's site: its group when its key is
in one (app.sites.gate reads groups the same way).
"""
from __future__ import annotations

import logging

from sqlalchemy import text

from app.extensions import db
from app.sites import service

log = logging.getLogger("fleethq.sites")

BASE_PAUSE_S = 60.0
MAX_PAUSE_S = 3600.0
STRIKE_MEMORY_S = 3600.0
REASON_MAX = 500

_CURRENT = """
SELECT strikes, until > now() AS active, until > now() - make_interval(secs => :memory) AS recent
FROM site_pauses WHERE site = :s FOR UPDATE
"""

_PAUSE = """
INSERT INTO site_pauses AS sp (site, until, reason, source, strikes)
VALUES (:s, now() + make_interval(secs => :secs), :r, :src, :strikes)
ON CONFLICT (site) DO UPDATE SET
    reason = CASE WHEN excluded.until > sp.until THEN excluded.reason ELSE sp.reason END,
    source = CASE WHEN excluded.until > sp.until THEN excluded.source ELSE sp.source END,
    until = GREATEST(sp.until, excluded.until), strikes = excluded.strikes, updated_at = now()
RETURNING extract(epoch FROM until - now())
"""


def pause_seconds(strikes: int, retry_after_s: float | None) -> float:
    grown = BASE_PAUSE_S * 2 ** min(max(strikes - 1, 0), 20)
    return min(MAX_PAUSE_S, max(grown, retry_after_s or 0.0))


def _retry_after(error: dict) -> float | None:
    details = error.get("details")
    value = details.get("retry_after_s") if isinstance(details, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    return None


def report(site_key: str, error: dict, worker_id: str) -> float:
    """Pause the job's site after a worker's pushback report, in the caller's
    transaction (it commits). Returns the seconds the site stays paused."""
    site = service.site_of(site_key)
    current = db.session.execute(text(_CURRENT), {"s": site, "memory": STRIKE_MEMORY_S}).first()
    if current is None or not (current.active or current.recent):
        strikes = 1
    else:
        strikes = current.strikes if current.active else current.strikes + 1
    retry_after = _retry_after(error)
    seconds = pause_seconds(strikes, retry_after)
    message = str(error.get("message") or error.get("code"))
    reason = f"{error.get('code')}: {message}"[:REASON_MAX]
    left = db.session.execute(text(_PAUSE), {"s": site, "secs": seconds, "r": reason,
                                             "src": f"worker {worker_id}"[:REASON_MAX],
                                             "strikes": strikes}).scalar_one()
    if current is None or not current.active:
        log.warning("site %s paused for %.0f s (strike %d, Retry-After %s): %s, reported by worker %s",
                    site, seconds, strikes, "none" if retry_after is None else f"{retry_after:g} s",
                    reason, worker_id)
    return float(left)
