"""``open_project_queue`` and the queue it returns: policy, paced claims,
reports, and the renewal thread's wire calls."""
from __future__ import annotations

import secrets
import string
import threading
import time

from workers.wire.protocol import JOB_TYPES, is_identifier, is_int
from workers.sdk._errors import FleetHQError, ProtocolError
from workers.sdk._jobs import ItemResult, Job, JobInfo
from workers.sdk._pacing import ClaimPacer
from workers.sdk._policy import Policy
from workers.sdk._renewal import BATCH, Renewer
from workers.sdk._transport import Transport, segment

MAX_WAIT_MS = 30_000


class _Reporter:
    """The per-item routes (complete, fail, extend-lease) of one queue."""

    def __init__(self, transport: Transport, project_id: str, worker_id: str):
        self._transport = transport
        self._path = f"projects/{segment(project_id)}/jobs"
        self._worker_id = worker_id

    def outcome(self, route: str, item: dict) -> ItemResult:
        body = {"worker_id": self._worker_id, "items": [item]}
        return self._results(self._transport.call("POST", f"{self._path}/{route}", body), 1)[0]

    def extend(self, jobs: list[Job], seconds: int, interrupt: threading.Event | None = None,
               deadline: float | None = None) -> list[ItemResult]:
        body = {"worker_id": self._worker_id, "extend_seconds": int(seconds),
                "items": [{"job_id": j.info.job_id, "attempt_id": j.info.attempt_id}
                          for j in jobs]}
        data = self._transport.call("POST", f"{self._path}/extend-lease", body,
                                    interrupt=interrupt, deadline=deadline)
        return self._results(data, len(jobs))

    def remaining(self, lease_expires_at: int, requested_s: float) -> float:
        """Seconds the lease lasts from when its request was sent: the
        requested length, shortened when the master cut it (a deadline).
        The master's clock comes from its Date header, so a skewed local
        clock does not cancel jobs early."""
        offset = self._transport.server_offset_s
        if offset is None:
            return float(requested_s)
        # lease_expires_at and Date are both whole seconds: allow one.
        by_clock = lease_expires_at + 1.0 - (time.time() + offset)
        return max(0.0, min(float(requested_s), by_clock))

    @staticmethod
    def _results(data: dict, count: int) -> list[ItemResult]:
        results = data.get("results")
        if not isinstance(results, list) or len(results) != count:
            raise ProtocolError(f"expected {count} result(s), got {results!r:.200}")
        return [ItemResult.from_wire(r) for r in results]


WORKER_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_worker_id() -> str:
    """A fresh seven-character ``a-z0-9`` id, one per queue instance, as
    SavewebHQ's SDKs make them: the master maps it to the token's user."""
    return "".join(secrets.choice(WORKER_ID_ALPHABET) for _ in range(7))


class ProjectQueue:
    """A worker's view of one project. Use :func:`open_project_queue`.

    Thread-safe for claims from several threads (they share the pacing) and
    for reporting jobs from any thread.
    """

    def __init__(self, transport: Transport, project_id: str, *, worker_id: str,
                 lease_seconds: int | None, long_poll_ms: int, renew: bool,
                 accept_types: tuple[str, ...] | None):
        self._transport = transport
        self._project_id = project_id
        self._worker_id = worker_id
        self._lease_seconds = lease_seconds
        self._long_poll_ms = long_poll_ms
        self._accept_types = accept_types
        self._claim_lock = threading.Lock()
        self._closed = threading.Event()
        self._pacer = ClaimPacer()
        self._policy: Policy | None = None
        self._policy_at = 0.0
        self._policy_stale = True
        self._reporter = _Reporter(transport, project_id, worker_id)
        self._renewer = (Renewer(self._reporter.extend, name=f"fleethq-renew-{project_id}")
                         if renew else None)

    # ------------------------------------------------------------ public

    @property
    def project_id(self) -> str:
        return self._project_id

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def policy(self) -> Policy:
        if self._policy is None:
            self.refresh_policy()
        assert self._policy is not None  # refresh_policy sets it or raises
        return self._policy

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def renewal_thread(self) -> threading.Thread | None:
        """The background renewal thread, once a job was claimed."""
        return self._renewer.thread if self._renewer else None

    def refresh_policy(self) -> Policy:
        """Fetch the policy now (``claim`` does it when it is due)."""
        data = self._transport.call("GET", f"projects/{segment(self._project_id)}")
        policy = Policy.from_wire(data)
        self._policy, self._policy_at, self._policy_stale = policy, time.monotonic(), False
        self._pacer.set_rate(policy.worker_claim_qps)
        return policy

    def claim(self, max_jobs: int | None = None, *, wait_ms: int | None = None) -> list[Job]:
        """Claim up to ``max_jobs`` jobs (clamped to ``max_jobs_per_claim``).

        Waits first as ``worker_claim_qps`` demands; with ``wait_ms`` (or the
        queue's ``long_poll_ms``) the master holds the request until a job
        arrives. An empty list means nothing was claimable.

        Raises:
            RateLimited: the master kept refusing after the retries.
            Conflict: the project is draining or archived (``project_not_active``).
            FleetHQError: the queue is closed; or any other API/transport error.
        """
        with self._claim_lock:
            data, lease, sent = self._send_claim(max_jobs, self._lease_seconds,
                                                 self._accept_types, wait_ms)
            jobs = self._jobs_from(data, lease, sent)
        if self._renewer is not None and jobs:
            try:
                self._renewer.track(jobs)
            except FleetHQError:  # closed while we claimed: these will not be renewed
                for job in jobs:
                    job.lose("the queue was closed")
        return jobs

    def claim_response(self, max_jobs: int | None = None, *, lease_seconds: int | None = None,
                       accept_types: list[str] | None = None,
                       wait_ms: int | None = None) -> dict:
        """Claim as :meth:`claim` does (policy, clamp, pacing, retries) but
        return the master's answer as sent: no ``Job`` handles, nothing renewed.
        For callers that report and extend by batch themselves
        (``workers.sdk.savewebhq``). ``lease_seconds`` and ``accept_types`` go
        into the request as given; None means the queue's own."""
        with self._claim_lock:
            data, _, _ = self._send_claim(
                max_jobs, self._lease_seconds if lease_seconds is None else lease_seconds,
                self._accept_types if accept_types is None else accept_types, wait_ms)
        return data

    def close(self) -> None:
        """Stop renewing (joins the thread) and release the HTTP session.
        Jobs still held get ``cancelled`` set: their leases will run out.
        Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        held = self._renewer.close() if self._renewer else []
        for job in held:
            job.lose("the queue was closed")
        self._transport.close()

    def __enter__(self) -> "ProjectQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ProjectQueue {self._project_id} worker {self._worker_id}>"

    # --------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise FleetHQError("queue is closed")

    def _send_claim(self, max_jobs, lease_seconds, accept_types,
                    wait_ms) -> tuple[dict, int, float]:
        """One paced claim request (the caller holds the claim lock); returns
        the answer, the lease asked for and when the request was sent."""
        if max_jobs is not None and (not is_int(max_jobs) or max_jobs < 1):
            raise ValueError("max_jobs must be an integer >= 1")
        wait_ms = self._long_poll_ms if wait_ms is None else wait_ms
        if not is_int(wait_ms) or not 0 <= wait_ms <= MAX_WAIT_MS:
            raise ValueError(f"wait_ms must be 0..{MAX_WAIT_MS}")
        self._check_open()
        policy = self._current_policy()
        if not self._pacer.wait(self._closed):
            self._check_open()
        self._pacer.started()
        want = min(max_jobs or policy.max_jobs_per_claim, policy.max_jobs_per_claim, BATCH)
        lease = policy.recommended_lease_seconds if lease_seconds is None else lease_seconds
        body = {"worker_id": self._worker_id, "max_jobs": want, "lease_seconds": lease,
                "policy_version": policy.policy_version}
        if accept_types is not None:
            body["accept_types"] = list(accept_types)
        if wait_ms:
            body["wait_ms"] = wait_ms
        sent = time.monotonic()
        data = self._transport.call("POST", f"projects/{segment(self._project_id)}/jobs/claim",
                                    body, extra_read_s=wait_ms / 1000.0)
        if not isinstance(data.get("jobs"), list) or not is_int(data.get("policy_version")):
            raise ProtocolError(f"claim answer has an unexpected shape: {data!r:.200}")
        self._after_claim(data, policy)
        return data, lease, sent

    def _current_policy(self) -> Policy:
        policy = self._policy
        if (policy is None or self._policy_stale
                or time.monotonic() - self._policy_at >= policy.refresh_after_ms / 1000.0):
            policy = self.refresh_policy()
        return policy

    def _jobs_from(self, data: dict, lease: int, sent: float) -> list[Job]:
        jobs = []
        for item in data["jobs"]:
            info = JobInfo.from_wire(item)
            jobs.append(Job(info, lease, reporter=self._reporter, tracker=self._renewer,
                            sent_mono=sent,
                            remaining_s=self._reporter.remaining(info.lease_expires_at, lease)))
        return jobs

    def _after_claim(self, data: dict, policy: Policy) -> None:
        # The hint is SavewebHQ's: a pause after an empty claim, and the
        # bucket's next token when the project is rate limited.
        pause = data.get("retry_after_ms")
        if is_int(pause) and pause > 0 and (not data["jobs"] or policy.dispatch_qps is not None):
            self._pacer.defer(pause / 1000.0)
        if data["policy_version"] != policy.policy_version:
            self._policy_stale = True
            try:
                self.refresh_policy()
            except FleetHQError:
                # The jobs are claimed already; losing them to a failed
                # refresh would be worse. The next claim refreshes first.
                pass


def open_project_queue(url: str, token: str, project_id: str, *, client_version: str,
                       worker_id: str | None = None, allow_http: bool = False, session=None,
                       lease_seconds: int | None = None, long_poll_ms: int = 0,
                       renew: bool = True, accept_types=None, retry=None,
                       timeout_s: float = 60.0) -> ProjectQueue:
    """Open a project's queue on the master at ``url`` and read its policy.

    Parameters:
        url: the master's base URL; https unless ``allow_http``.
        token: a machine token (role worker) or an enrolled node's secret.
        project_id: the project to work on.
        client_version: sent as ``X-SavewebHQ-Client-Version``; must be on the
            project's allow-list.
        worker_id: this worker's id; default: a node's own id, else a fresh
            seven-character id for this queue instance.
        allow_http: permit plain http (the token then travels in clear).
        session: a ``requests.Session`` to send with (never mutated).
        lease_seconds: lease to ask for; default the policy's recommendation.
        long_poll_ms: default ``wait_ms`` of ``claim`` (0..30000).
        renew: renew leases in the background every quarter lease.
        accept_types: job types to claim (``seed``, ``asset``); default both.
        retry: a :class:`RetryPolicy` for 429, 5xx and network errors.
        timeout_s: read timeout of one request (long-polls add their wait).

    Returns:
        A :class:`ProjectQueue`; close it (or use it as a context manager).

    Raises:
        ProtocolError: plain http without ``allow_http``; a malformed answer.
        AuthError, NotFound, UpgradeRequired: the master refused the policy read.
    """
    if not is_identifier(project_id):
        raise ValueError("project_id must be 1..128 of [A-Za-z0-9._:-]")
    if worker_id is not None and not is_identifier(worker_id):
        raise ValueError("worker_id must be 1..128 of [A-Za-z0-9._:-]")
    if lease_seconds is not None and (not is_int(lease_seconds) or not 1 <= lease_seconds <= 3600):
        raise ValueError("lease_seconds must be 1..3600")
    if not is_int(long_poll_ms) or not 0 <= long_poll_ms <= MAX_WAIT_MS:
        raise ValueError(f"long_poll_ms must be 0..{MAX_WAIT_MS}")
    if accept_types is not None:
        accept_types = tuple(accept_types)
        if not accept_types or any(t not in JOB_TYPES for t in accept_types):
            raise ValueError(f"accept_types must be a non-empty subset of {JOB_TYPES}")
    transport = Transport(url, token, client_version, allow_http=allow_http, session=session,
                          retry=retry, timeout_s=timeout_s)
    try:
        if worker_id is None:
            # An enrolled node must use its node id; whoami tells it.
            who = transport.call("GET", "whoami")
            node_id = who.get("worker_id")
            worker_id = node_id if is_identifier(node_id) else new_worker_id()
        queue = ProjectQueue(transport, project_id, worker_id=worker_id,
                             lease_seconds=lease_seconds, long_poll_ms=long_poll_ms,
                             renew=renew, accept_types=accept_types)
        queue.refresh_policy()
    except BaseException:
        transport.close()
        raise
    return queue
