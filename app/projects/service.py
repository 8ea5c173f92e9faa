"""Create, change, read and delete projects."""
from __future__ import annotations

import operator

from dataclasses import dataclass, fields

from sqlalchemy import select, text

from app import audit
from app.errors import Conflict, InvalidRequest, NotFound
from app.extensions import db
from app.projects import counters, policy
from app.projects.models import Project, ProjectDispatch, savewebhq_state

SUMMARY_FIELDS = ("id",) + policy.POLICY_FIELDS + ("policy_version",)
# The v1 contract's AdminProjectSummary: exactly these fields, plus
# ``job_counts`` of the five contract states and the two timestamps.
CONTRACT_SUMMARY_FIELDS = ("id", "status", "identity_mode", "claim_order", "dispatch_qps",
                           "worker_claim_qps", "max_jobs_per_claim", "max_resets",
                           "recommended_lease_seconds", "client_versions", "policy_version")
CONTRACT_STATES = ("todo", "wip", "done", "failed", "reset_exhausted")


@dataclass(frozen=True)
class ProjectView:
    """A read-only snapshot of a project row for the hot worker routes,
    fetched with plain SQL (no ORM identity map or change tracking)."""
    id: str
    kind: str
    status: str
    identity_mode: str
    claim_order: str
    dispatch_qps: float | None
    worker_claim_qps: float | None
    max_jobs_per_claim: int
    max_resets: int
    recommended_lease_seconds: int
    retry_backoff_seconds: int
    client_versions: list
    max_in_flight: int | None
    max_worker_in_flight: int | None
    prefer_new_worker: bool
    max_worker_attempts: int | None
    task_timeout_seconds: int | None
    attempt_timeout_seconds: int | None
    upload_timeout_seconds: int
    fallback_after_seconds: int
    lane_order: str
    policy_version: int
    # Whether a site rule or pause may touch this project's claims (computed,
    # see _COMPUTED): a claim without one skips app.sites.gate entirely.
    site_rules: bool = False


# Fields that are not columns of ``projects``. Both tables are a handful of
# rows at most, so the claim pays no measurable cost for the question.
_COMPUTED = {
    "site_rules": "(EXISTS (SELECT 1 FROM site_limits sl WHERE sl.project_id IS NULL OR sl.project_id = p.id)"
                  " OR EXISTS (SELECT 1 FROM site_pauses sp WHERE sp.until > now()))",
}
# The view's columns of projects ``p``, named project_<field> so that they
# can share a row with other tables' columns and be read by name.
VIEW_COLUMNS = ", ".join(f"{_COMPUTED.get(f.name, 'p.' + f.name)} AS project_{f.name}"
                         for f in fields(ProjectView))
_VIEW_OF_NAMED = operator.attrgetter(*(f"project_{f.name}" for f in fields(ProjectView)))


def view_from_row(row) -> ProjectView | None:
    """The view from a row of exactly ``VIEW_COLUMNS``; None when the project
    was not found (a LEFT JOIN's nulls)."""
    return None if row[0] is None else ProjectView(*row)


def view_from_named(row) -> ProjectView | None:
    """The view from a named row holding ``VIEW_COLUMNS`` among others."""
    return view_from_row(_VIEW_OF_NAMED(row))


def not_found(project_id: str) -> NotFound:
    return NotFound(f"project {project_id!r} not found", details={"project_id": project_id})


def view(project_id: str) -> ProjectView:
    row = db.session.execute(text(f"SELECT {VIEW_COLUMNS} FROM projects p WHERE p.id = :p"),
                             {"p": project_id}).first()
    found = None if row is None else view_from_row(row)
    if found is None:
        raise not_found(project_id)
    return found


def get(project_id: str, *, lock: bool = False) -> Project:
    stmt = select(Project).where(Project.id == project_id)
    if lock:
        stmt = stmt.with_for_update()
    project = db.session.scalars(stmt).first()
    if project is None:
        raise not_found(project_id)
    return project


def _locked(project_id: str) -> Project | None:
    return db.session.scalars(
        select(Project).where(Project.id == project_id).with_for_update()).first()


def _create(project_id: str, values: dict) -> Project:
    project = Project(id=project_id, policy_version=1, **values)
    db.session.add(project)
    db.session.add(ProjectDispatch(project_id=project_id, tokens=0.0))
    audit.record("project.create", "project", project_id, values)
    db.session.commit()
    return project


def _check_fixed(project: Project, clean: dict) -> None:
    for name in policy.FIXED_FIELDS & clean.keys():
        if clean[name] != getattr(project, name):
            raise InvalidRequest(f"{name} is fixed at project creation", details={"field": name})


def _change(project: Project, clean: dict) -> Project:
    """Apply policy values to a locked project, bumping ``policy_version``
    when a versioned field changes. Commits."""
    bump = any(name in policy.VERSIONED_FIELDS and getattr(project, name) != value
               for name, value in clean.items())
    changed = {name: {"from": getattr(project, name), "to": value} for name, value in clean.items()
               if getattr(project, name) != value}
    if changed:
        status = changed.pop("status", None)
        if status:
            audit.record("project.status", "project", project.id, status)
        if changed:
            audit.record("project.update", "project", project.id, changed)
    for name, value in clean.items():
        setattr(project, name, value)
    if bump:
        project.policy_version += 1
    project.updated_at = db.func.now()
    db.session.commit()
    if clean.get("status") == "active" or bump or clean.keys() & {"fallback_after_seconds", "lane_order"}:
        # A reactivated project or a looser policy may release waiting claimers.
        from app.projects import wakeups
        wakeups.notify(project.id)
        db.session.commit()
    return project


def put(project_id: str, fields: dict, *, partial: bool) -> tuple[Project, bool]:
    """Create a project or change its policy (FleetHQ's own semantics). Commits.

    Parameters:
        fields: policy fields (validated here).
        partial: PATCH semantics; a full PUT of an existing project resets
            omitted fields to their defaults (except the fixed ones).

    Returns:
        The project and whether it was created.

    Raises:
        InvalidRequest: a bad field, or an attempt to change a fixed field.
        NotFound: PATCH of a project that does not exist.
    """
    policy.validate_project_id(project_id)
    clean = policy.validate_fields(fields)
    project = _locked(project_id)
    if project is None:
        if partial:
            raise not_found(project_id)
        values = policy.defaults(clean.get("kind", "generic"))
        values.update(clean)
        return _create(project_id, values), True
    _check_fixed(project, clean)
    if not partial:
        base = policy.defaults(project.kind)
        base.update({k: getattr(project, k) for k in policy.FIXED_FIELDS})
        base.update(clean)
        clean = base
    return _change(project, clean), False


def put_contract(project_id: str, fields: dict) -> tuple[Project, bool]:
    """Create a project or change it with the v1 contract's PUT. Commits.

    A new project is generic with the defaults for what the request leaves
    out. On an existing project the request sets the fields it names, keeps
    ``identity_mode`` and ``claim_order`` when omitted, returns an omitted
    ``max_resets`` / ``recommended_lease_seconds`` to its default, and never
    touches the kind or FleetHQ's own fields (a pdf project stays pdf).

    Raises:
        InvalidRequest: unknown or missing fields, bad values, or a
        different ``identity_mode``.
    """
    policy.validate_project_id(project_id)
    clean = policy.validate_contract_request(fields)
    project = _locked(project_id)
    if project is None:
        values = policy.defaults("generic")
        values.update(clean)
        return _create(project_id, values), True
    _check_fixed(project, clean)
    defaults = policy.defaults(project.kind)
    for name in policy.CONTRACT_OPTIONAL:
        if name not in clean and name not in policy.CONTRACT_KEPT_WHEN_OMITTED:
            clean[name] = defaults[name]
    return _change(project, clean), False


def delete(project_id: str) -> None:
    """Delete a project and its jobs (A4). Commits.

    Raises:
        NotFound: no such project.
        InvalidRequest: jobs are in flight (wip or staged).
    """
    project = get(project_id, lock=True)
    live = db.session.execute(text(
        "SELECT count(*) FROM jobs WHERE project_id = :p AND state IN ('wip', 'staged')"),
        {"p": project_id}).scalar()
    if live:
        raise InvalidRequest(f"project has {live} jobs in flight; drain it first",
                             details={"in_flight": live})
    counts = counters.job_counts([project_id])[project_id]
    db.session.delete(project)
    db.session.flush()
    counters.forget_project(project_id)
    audit.record("project.delete", "project", project_id, {"jobs": sum(counts.values())})
    db.session.commit()


def summary(project: Project, counts: dict | None = None) -> dict:
    """FleetHQ's full view: kind, every policy field, counts of all six states."""
    out = {name: getattr(project, name) for name in SUMMARY_FIELDS}
    out["job_counts"] = counts if counts is not None else counters.job_counts([project.id])[project.id]
    out["created_at"] = int(project.created_at.timestamp())
    out["updated_at"] = int(project.updated_at.timestamp())
    return out


def contract_counts(counts: dict) -> dict:
    """The five contract states; a ``staged`` job (an upload waiting for its
    archive commit) is still in flight, so it counts as ``wip``."""
    out = dict.fromkeys(CONTRACT_STATES, 0)
    for state, n in counts.items():
        out[savewebhq_state(state)] += n
    return out


def contract_summary(project: Project, counts: dict | None = None) -> dict:
    """The v1 contract's AdminProjectSummary: exactly its 14 fields."""
    if counts is None:
        counts = counters.job_counts([project.id])[project.id]
    out = {name: getattr(project, name) for name in CONTRACT_SUMMARY_FIELDS}
    out["client_versions"] = list(project.client_versions)
    out["job_counts"] = contract_counts(counts)
    out["created_at"] = int(project.created_at.timestamp())
    out["updated_at"] = int(project.updated_at.timestamp())
    return out


def list_summaries(limit: int = 500, *, view=summary) -> list[dict]:
    """Projects in id order, each rendered by ``view`` (``summary`` or
    ``contract_summary``); the counts of all of them come from one query."""
    projects = db.session.scalars(select(Project).order_by(Project.id).limit(limit)).all()
    counts = counters.job_counts([p.id for p in projects])
    return [view(p, counts[p.id]) for p in projects]


def worker_policy(project: Project, refresh_ms: int) -> dict:
    """Exactly the fields of ``GET /api/v1/projects/{p}`` (DESIGN §6)."""
    return {
        "project_id": project.id,
        "dispatch_qps": project.dispatch_qps,
        "worker_claim_qps": project.worker_claim_qps,
        "max_jobs_per_claim": project.max_jobs_per_claim,
        "recommended_lease_seconds": project.recommended_lease_seconds,
        "policy_version": project.policy_version,
        "refresh_after_ms": refresh_ms,
    }


def ensure_status(project: Project | ProjectView, *allowed: str) -> None:
    if project.status not in allowed:
        raise Conflict(f"project {project.id!r} is {project.status}", code="project_not_active",
                       details={"status": project.status})
