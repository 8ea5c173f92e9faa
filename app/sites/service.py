"""Site rules an operator keeps: limits, groups and pauses by hand; and the
overview the pages, the CLI and the API show. Each change is audited and
commits. The claim reads the same tables (app.sites.gate)."""
from __future__ import annotations

import math

from sqlalchemy import text

from app import audit
from app.errors import Conflict, InvalidRequest, NotFound
from app.extensions import db
from app.sites import keys

MAX_IN_FLIGHT = 100_000
MAX_STARTS_PER_S = 10_000.0
MAX_PAUSE_S = 30 * 86400
MAX_GROUP_KEYS = 1000


def site_name(raw, field: str = "site") -> str:
    try:
        return keys.normalize(raw)
    except keys.InvalidSiteKey as exc:
        raise InvalidRequest(f"{field}: {exc}", details={"field": field}) from None


def _group_of(key: str) -> str | None:
    return db.session.execute(text("SELECT site FROM site_groups WHERE site_key = :k"),
                              {"k": key}).scalar()


def site_of(key: str) -> str:
    """The site a key counts for: its group when it is in one, else itself."""
    return _group_of(key) or key


def _refuse_member(site: str) -> None:
    group = _group_of(site)
    if group is not None and group != site:
        raise Conflict(f"{site} belongs to the site {group}: set the rule on {group}",
                       code="site_in_group", details={"site": site, "group": group})


def _project(project_id: str | None) -> None:
    if project_id is not None and db.session.execute(
            text("SELECT 1 FROM projects WHERE id = :p"), {"p": project_id}).first() is None:
        raise NotFound(f"project {project_id!r} not found", details={"project_id": project_id})


def set_limit(site: str, *, project_id: str | None = None, max_in_flight: int | None = None,
              max_starts_per_s: float | None = None, reason: str | None = None) -> dict:
    """Create or replace the rule of ``site`` (fleet-wide, or for one project)."""
    site = site_name(site)
    if max_in_flight is None and max_starts_per_s is None:
        raise InvalidRequest("a limit needs max_in_flight, max_starts_per_s or both "
                             "(to lift one, remove the rule)", details={"field": "max_in_flight"})
    if max_in_flight is not None and not (isinstance(max_in_flight, int) and 0 <= max_in_flight <= MAX_IN_FLIGHT):
        raise InvalidRequest(f"max_in_flight must be an integer 0..{MAX_IN_FLIGHT}",
                             details={"field": "max_in_flight"})
    if max_starts_per_s is not None and not (
            isinstance(max_starts_per_s, (int, float)) and math.isfinite(max_starts_per_s)
            and 0 < max_starts_per_s <= MAX_STARTS_PER_S):
        raise InvalidRequest(f"max_starts_per_s must be a number above 0, at most {MAX_STARTS_PER_S:g}",
                             details={"field": "max_starts_per_s"})
    _project(project_id)
    _refuse_member(site)
    db.session.execute(text("""
        INSERT INTO site_limits (site, project_id, max_in_flight, max_starts_per_s)
        VALUES (:s, :p, :m, :r)
        ON CONFLICT (site, (COALESCE(project_id, ''))) DO UPDATE SET
            max_in_flight = excluded.max_in_flight, max_starts_per_s = excluded.max_starts_per_s,
            updated_at = now()"""),
        {"s": site, "p": project_id, "m": max_in_flight,
         "r": float(max_starts_per_s) if max_starts_per_s is not None else None})
    rule = {"site": site, "project_id": project_id, "max_in_flight": max_in_flight,
            "max_starts_per_s": max_starts_per_s}
    audit.record("sites.limit", "site", site, rule, reason=reason)
    db.session.commit()
    return rule


def remove_limit(site: str, *, project_id: str | None = None, reason: str | None = None) -> dict:
    site = site_name(site)
    gone = db.session.execute(text(
        "DELETE FROM site_limits WHERE site = :s AND project_id IS NOT DISTINCT FROM :p RETURNING id"),
        {"s": site, "p": project_id}).first()
    if gone is None:
        db.session.rollback()
        where = f" for project {project_id!r}" if project_id else " for the whole fleet"
        raise NotFound(f"no limit on {site}{where}", details={"site": site, "project_id": project_id})
    audit.record("sites.unlimit", "site", site, {"project_id": project_id}, reason=reason)
    db.session.commit()
    return {"site": site, "project_id": project_id, "removed": True}


def set_group(site: str, members: list, *, reason: str | None = None) -> dict:
    """Make ``site`` the group of exactly these keys (an empty list dissolves it)."""
    site = site_name(site)
    if not isinstance(members, list) or len(members) > MAX_GROUP_KEYS:
        raise InvalidRequest(f"keys must be a list of at most {MAX_GROUP_KEYS} site keys",
                             details={"field": "keys"})
    wanted = sorted({site_name(k, "keys") for k in members} - {site})
    group = _group_of(site)
    if group not in (None, site):
        raise Conflict(f"{site} is itself a key of the site {group}", code="site_in_group",
                       details={"site": site, "group": group})
    taken = db.session.execute(text(
        "SELECT site_key, site FROM site_groups WHERE site_key = ANY(:k) AND site <> :s"),
        {"k": wanted, "s": site}).first()
    if taken is not None:
        raise Conflict(f"{taken[0]} already belongs to the site {taken[1]}", code="site_in_group",
                       details={"site": taken[0], "group": taken[1]})
    ruled = db.session.execute(text(
        "SELECT site FROM site_limits WHERE site = ANY(:k) UNION SELECT site FROM site_pauses "
        "WHERE site = ANY(:k) AND until > now() LIMIT 1"), {"k": wanted}).scalar()
    if ruled is not None:
        raise Conflict(f"{ruled} has limits or a pause of its own: remove them first, then group it",
                       code="site_in_group", details={"site": ruled})
    db.session.execute(text("DELETE FROM site_groups WHERE site = :s"), {"s": site})
    if wanted:
        db.session.execute(text("INSERT INTO site_groups (site_key, site) VALUES (:k, :s)"),
                           [{"k": k, "s": site} for k in wanted])
    audit.record("sites.group", "site", site, {"keys": wanted}, reason=reason)
    db.session.commit()
    return {"site": site, "keys": wanted}


def pause(site: str, seconds: float, *, reason: str, source: str = "operator") -> dict:
    """No worker starts a job of ``site`` for ``seconds`` (replacing a shorter pause)."""
    site = site_name(site)
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and 1 <= seconds <= MAX_PAUSE_S):
        raise InvalidRequest(f"seconds must be 1..{MAX_PAUSE_S}", details={"field": "seconds"})
    _refuse_member(site)
    until = db.session.execute(text("""
        INSERT INTO site_pauses (site, until, reason, source)
        VALUES (:s, now() + make_interval(secs => :n), :r, :src)
        ON CONFLICT (site) DO UPDATE SET until = GREATEST(site_pauses.until, excluded.until),
            reason = excluded.reason, source = excluded.source, updated_at = now()
        RETURNING extract(epoch FROM until)"""),
        {"s": site, "n": float(seconds), "r": reason, "src": source}).scalar_one()
    audit.record("sites.pause", "site", site, {"seconds": seconds, "source": source}, reason=reason)
    db.session.commit()
    return {"site": site, "paused_until": float(until), "reason": reason, "source": source}


def resume(site: str, *, reason: str | None = None) -> dict:
    site = site_name(site)
    gone = db.session.execute(text("DELETE FROM site_pauses WHERE site = :s RETURNING until > now()"),
                              {"s": site}).first()
    if gone is None or not gone[0]:
        db.session.rollback()
        raise NotFound(f"{site} is not paused", details={"site": site})
    audit.record("sites.resume", "site", site, {}, reason=reason)
    db.session.commit()
    return {"site": site, "resumed": True}


def overview() -> dict:
    """Every rule with its attempts in flight now, the groups, the pauses in force."""
    groups: dict[str, list[str]] = {}
    for site, key in db.session.execute(text(
            "SELECT site, site_key FROM site_groups ORDER BY site, site_key")).all():
        groups.setdefault(site, []).append(key)
    limits = []
    for row in db.session.execute(text("""
            SELECT l.site, l.project_id, l.max_in_flight, l.max_starts_per_s,
                   extract(epoch FROM l.updated_at) AS updated_at,
                   (SELECT count(*) FROM jobs j WHERE j.state = 'wip'
                      AND j.site_key = ANY(ARRAY[l.site] || COALESCE(
                          (SELECT array_agg(g.site_key) FROM site_groups g WHERE g.site = l.site), '{}'))
                      AND (l.project_id IS NULL OR j.project_id = l.project_id)) AS in_flight
            FROM site_limits l ORDER BY l.site, l.project_id NULLS FIRST""")).mappings():
        limits.append({**row, "updated_at": float(row["updated_at"])})
    pauses = [{**r, "until": float(r["until"])} for r in db.session.execute(text("""
        SELECT site, extract(epoch FROM until) AS until, reason, source, strikes
        FROM site_pauses WHERE until > now() ORDER BY until""")).mappings()]
    return {"limits": limits, "groups": [{"site": s, "keys": k} for s, k in groups.items()],
            "pauses": pauses}
