"""The claim loop: fill free fetch slots from the configured pdf projects.

Claims only when the node is active, its heartbeat is fresh, a slot is free,
the ready files stay under the spool cap and the volume has free space. Each
claimed job is journaled ``downloading`` before its fetch starts, so a crash
during the download is recovered (runner.resume). With one project the claim
long-polls (the master answers as soon as a job arrives); with several, each
is asked in turn without waiting (a long poll on an empty project would starve
the others), in the order and proportions of the projects' share weights
(``shares``), and a round that finds nothing sleeps a second.
"""
from __future__ import annotations

import logging
import time

from workers.runner.master import MasterError, Refused, seg
from workers.runner.shares import Shares

log = logging.getLogger("fleethq.worker")

SOLO_WAIT_MS = 10_000
ROUND_IDLE_S = 1.0


class Claimer:
    def __init__(self, runner):
        self.r = runner
        self._skip_until: dict[str, float] = {}
        self._next = 0
        self._paused_reason: str | None = None
        self._unreachable = 0
        self.shares = Shares()

    def _pause(self, reason: str | None) -> bool:
        if reason != self._paused_reason:
            if reason:
                log.info("claims paused: %s", reason)
            elif self._paused_reason:
                log.info("claims resumed")
            self._paused_reason = reason
        return reason is not None

    def _blocked(self) -> str | None:
        r, s = self.r, self.r.settings
        if r.status != "active":
            return f"node is {r.status}"
        if r.broken:
            return f"this worker cannot do its task: {r.broken}"
        backing_off = r.fitness.paused()
        if backing_off:
            return backing_off
        if not r.heartbeat_fresh():
            return "no recent heartbeat answer"
        if len(r.in_browser) >= s.concurrency:
            return f"{len(r.in_browser)} downloads wait for the browser lane"
        waiting = len(r.journal.entries("ready"))
        if waiting >= 2 * s.concurrency:
            # Downloads outpace uploads: more claims would only hold jobs
            # (leases) that other workers could be fetching.
            return f"{waiting} files wait for upload"
        spool = r.spool_bytes()
        if spool >= s.spool_max_bytes:
            return f"ready files use {spool} bytes (cap {s.spool_max_bytes})"
        free = r.volume.disk_free()
        if free < s.min_free_bytes:
            return f"{free} bytes free on the volume (need {s.min_free_bytes})"
        return None

    def loop(self) -> None:
        r = self.r
        while not r.stop.is_set():
            if self._free() <= 0:
                r.claim_wake.wait(1.0)
                r.claim_wake.clear()
                continue
            if self._pause(self._blocked()):
                r.claim_wake.wait(2.0)
                r.claim_wake.clear()
                continue
            projects = self._due_projects()
            if not projects:
                r.stop.wait(1.0)
                continue
            if len(r.settings.projects) == 1:
                self._try(projects[0], SOLO_WAIT_MS)
                continue
            if not self._round(projects):
                r.stop.wait(ROUND_IDLE_S)

    def _round(self, due: list[str]) -> int:
        """Ask the due projects by their shares; returns how many gave jobs."""
        r = self.r
        return self.shares.round(r.settings.projects, due,
                                 lambda: 0 if r.stop.is_set() else self._free(),
                                 lambda project, n: self._try(project, 0, n))

    def _free(self) -> int:
        return self.r.fitness.slots(self.r.settings.concurrency) - self.r.http_stage()

    def _due_projects(self) -> list[str]:
        projects = self.r.settings.projects
        now = time.monotonic()
        self._next = (self._next + 1) % len(projects)
        rotated = projects[self._next:] + projects[:self._next]   # fair start of each round
        return [p for p in rotated if self._skip_until.get(p, 0) <= now]

    def _try(self, project: str, wait_ms: int, jobs: int | None = None) -> int:
        try:
            got = self._claim(project, self._free() if jobs is None else jobs, wait_ms)
            self._unreachable = 0
            return got
        except Refused as exc:
            self.r.refuse(exc)
        except MasterError as exc:
            self._error(project, exc)
        return 0

    def _claim(self, project: str, free: int, wait_ms: int) -> int:
        r = self.r
        _, answer = r.master.call("POST", f"/api/v1/projects/{seg(project)}/jobs/claim",
                                  timeout=wait_ms / 1000 + 30, body={
                                      "worker_id": r.worker_id, "max_jobs": free,
                                      "lease_seconds": r.settings.lease_s, "wait_ms": wait_ms})
        jobs = answer.get("jobs") or []
        if jobs:
            entries = [{"attempt_id": str(job["attempt_id"]), "job_id": str(job["job_id"]),
                        "project": project, "value": job["value"], "state": "downloading"}
                       for job in jobs]
            r.journal.add(*entries)
            for entry in entries:
                log.info("attempt %s (job %s, %s): claimed %s", entry["attempt_id"],
                         entry["job_id"], project, entry["value"][:200])
                r.start_fetch(entry)
        elif answer.get("retry_after_ms"):
            self._skip_until[project] = time.monotonic() + min(answer["retry_after_ms"] / 1000, 60.0)
        return len(jobs)

    def _error(self, project: str, exc: MasterError) -> None:
        r = self.r
        skip = 0.0
        if exc.status is None:
            self._unreachable += 1
            skip = min(10.0, 2.0 ** min(self._unreachable, 4))
        elif exc.status == 429:
            skip = exc.retry_after_s or 1.0
        elif exc.status == 409 and exc.code == "invalid_transition":
            r.beat_soon()  # the master wants a fresher heartbeat first
            skip = 1.0
        elif exc.status == 403 and exc.details.get("reason") == "awaiting_approval":
            r.status = "pending"
            skip = 10.0
        elif exc.status in (404, 409, 426, 403):
            # Unknown project, not active, this client version not allowed,
            # or not permitted: an admin must act; ask again in a minute.
            skip = 60.0
        else:
            skip = exc.retry_after_s or 5.0
        self._skip_until[project] = time.monotonic() + skip
        level = logging.INFO if exc.status in (429,) else logging.WARNING
        said = f"{exc}{_versions_hint(exc)}"
        log.log(level, "claim from %s: %s (next try in %.0f s)", project, said, skip)
        if exc.status != 429:
            r.note_error(f"claim {project}: {said}"[:2048])


def _versions_hint(exc: MasterError) -> str:
    """For a 426: the version this worker sent and the ones the project
    allows (the master names both), so the log says what to change."""
    if exc.status != 426:
        return ""
    allowed = exc.details.get("client_versions")
    sent = exc.details.get("client_version")
    shown = ", ".join(str(v) for v in allowed) if isinstance(allowed, list) and allowed else "none"
    return (f" (this worker sends {sent!r}; the project allows: {shown}; "
            "set --client-version or change the project's client_versions)")
