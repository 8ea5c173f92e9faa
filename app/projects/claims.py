"""Serving one claim request: the rules on who may claim, the long poll,
and the claim's bookkeeping (the worker seen, the claim audit, the release
of leases whose answer never reached the worker).

The job states themselves move only in ``app.projects.leasing``; this module
decides when to ask it and what the request is owed. The HTTP view parses
the body, calls :func:`serve` and answers what it returns.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.errors import Conflict, RateLimited
from app.fleet import service as fleet
from app.fleet.lanes import Lane
from app.projects import claim_audit, leasing, service, wakeups
from app.projects.leasing import ClaimResult, Worker
from app.projects.models import UPLOAD_KINDS
from workers.wire.protocol import JOB_TYPES


@dataclass(frozen=True)
class Settings:
    """The configuration a claim reads (app.config holds the values)."""
    listen_dsn: str
    node_lease_s: float        # a heartbeat this old is no longer fresh
    worker_stale_s: float      # a first-choice worker this quiet no longer counts as free
    reap_limit: int            # expired leases reset per claim, at most

    @classmethod
    def from_config(cls, config: Mapping) -> Settings:
        return cls(config["LISTEN_DSN"], config["NODE_LEASE_S"], config["WORKER_STALE_S"],
                   config["CLAIM_REAP_LIMIT"])


@dataclass(frozen=True)
class Standing:
    """The caller's standing, read with its credentials."""
    status: str                     # active, draining… (nodes and token workers)
    heartbeat_age_s: float | None   # None: never sent one
    lane: Lane = Lane()


@dataclass(frozen=True)
class Request:
    max_jobs: int
    lease_seconds: int
    accept_types: tuple[str, ...] = ()   # empty: every type
    policy_version: int | None = None    # what the worker last read, for the audit
    wait_s: float = 0.0


def serve(project: service.ProjectView, worker: Worker, standing: Standing, request: Request,
          settings: Settings, client_gone: Callable[[], bool]) -> ClaimResult:
    """Lease jobs to ``worker``, waiting up to ``request.wait_s`` for some.

    ``client_gone`` tells whether the caller has hung up: only a claim that
    slept can have outlived its client, and its jobs are then given back at
    once (a closed connection would otherwise keep them ``wip`` for a whole
    lease and cost each a reset). Commits.

    Raises:
        Conflict: an upload project's worker without a fresh heartbeat
            (``invalid_transition``); a project that is not active
            (``project_not_active``).
        RateLimited: the project's dispatch bucket is empty while jobs wait.
    """
    if worker.owner is not None:
        fleet.note_token_worker(worker.owner, worker.worker_id)
    if standing.status == "draining":  # finishes its work, gets no more
        return empty(project)
    heartbeat = standing.heartbeat_age_s
    if project.kind in UPLOAD_KINDS and (heartbeat is None or heartbeat > settings.node_lease_s):
        raise Conflict(f"{project.kind} projects need a fresh heartbeat before claiming "
                       "(POST /api/v1/fleet/heartbeat)", code="invalid_transition")
    accept = request.accept_types or JOB_TYPES
    current = project

    def look(waited: bool) -> ClaimResult | None:
        nonlocal current
        if waited:
            if client_gone():
                return None  # nobody to answer: lease nothing
            current = service.view(project.id)  # its policy may have changed meanwhile
        try:
            return leasing.claim(current, worker, max_jobs=request.max_jobs,
                                 lease_seconds=request.lease_seconds, accept_types=accept,
                                 reap_limit=settings.reap_limit, fresh_after_s=settings.node_lease_s,
                                 lane=standing.lane, stale_after_s=settings.worker_stale_s)
        except RateLimited:
            claim_audit.record(current, worker.worker_id, 0, request.policy_version)
            raise

    def wake_hint(result: ClaimResult | None) -> float | None:
        recheck = result.recheck_s if result is not None else None
        hints = [h for h in (leasing.next_claimable_in(project.id), recheck) if h is not None]
        return min(hints, default=None)

    result, waited = wakeups.long_poll(settings.listen_dsn, project.id, request.wait_s, look,
                                       done=lambda r: r is None or bool(r.jobs), wake_hint=wake_hint)
    if result is not None and result.jobs and waited and client_gone():  # went away while we leased
        leasing.release_undelivered([int(job["attempt_id"]) for job in result.jobs])
        result = None
    claim_audit.record(current, worker.worker_id, len(result.jobs) if result else 0,
                       request.policy_version)
    return result if result is not None else empty(current)


def empty(project) -> ClaimResult:
    """No jobs: ask again after the idle pause."""
    return ClaimResult([], leasing.IDLE_RETRY_MS, project.policy_version)
