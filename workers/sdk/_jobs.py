"""Job handles: the frozen facts of one claim plus the live state of its lease."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from workers.wire.protocol import is_identifier, is_int
from workers.sdk._errors import LeaseLost, ProtocolError

OUTCOME_KINDS = ("success", "http_error", "skipped")
MAX_MESSAGE_BYTES = 2048


@dataclass(frozen=True)
class JobInfo:
    """What the master handed out with this attempt; never changes.

    ``lease_expires_at`` is the lease granted by the claim (UNIX seconds);
    ``Job.lease_expires_at`` follows the renewals. ``id``, ``via``, ``hops``
    and ``attr`` are None when the job does not set them.
    """
    job_id: int
    attempt_id: str
    value: str
    id: str | None
    type: str
    via: str | None
    hops: int | None
    attr: dict | None
    lease_expires_at: int

    @classmethod
    def from_wire(cls, job) -> "JobInfo":
        try:
            info = cls(job_id=job["job_id"], attempt_id=job["attempt_id"], value=job["value"],
                       id=job.get("id"), type=job.get("type", "seed"), via=job.get("via"),
                       hops=job.get("hops"), attr=job.get("attr"),
                       lease_expires_at=job["lease_expires_at"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"claimed job has an unexpected shape: {exc!r}") from None
        if not (is_int(info.job_id) and info.job_id >= 1 and is_identifier(info.attempt_id)
                and isinstance(info.value, str) and is_int(info.lease_expires_at)):
            raise ProtocolError(f"claimed job has an unexpected shape: {job!r:.200}")
        return info


@dataclass(frozen=True)
class ItemResult:
    """The master's answer for one item of complete, fail or extend-lease."""
    job_id: int
    attempt_id: str
    status: str                      # applied | rejected
    job_status: str | None
    lease_expires_at: int | None
    error: dict | None

    @classmethod
    def from_wire(cls, item) -> "ItemResult":
        try:
            result = cls(job_id=item["job_id"], attempt_id=item["attempt_id"],
                         status=item["status"], job_status=item.get("job_status"),
                         lease_expires_at=item.get("lease_expires_at"), error=item.get("error"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"result item has an unexpected shape: {exc!r}") from None
        if result.status not in ("applied", "rejected"):
            raise ProtocolError(f"result status {result.status!r} is neither applied nor rejected")
        return result

    def reason(self) -> str:
        error = self.error if isinstance(self.error, dict) else {}
        return str(error.get("message") or error.get("code") or "rejected")


class Job:
    """One claimed attempt. Report it exactly once with :meth:`complete` or
    :meth:`fail`; until then the queue renews its lease in the background.

    ``cancelled`` (a ``threading.Event``) is set when the lease is lost — a
    renewal was rejected, the lease ran out before a renewal got through, a
    report was rejected, or the queue was closed while the job was held. A
    worker should check it (or wait on it) and stop working on the job.
    """

    def __init__(self, info: JobInfo, lease_seconds: int, *, reporter, tracker,
                 sent_mono: float, remaining_s: float):
        self.info = info
        self.lease_seconds = lease_seconds
        self.cancelled = threading.Event()
        self._reporter = reporter            # sends complete/fail/extend for this queue
        self._tracker = tracker              # the queue's renewer (or None)
        self._lock = threading.Lock()
        self._lease_expires_at: int = info.lease_expires_at
        self._cancel_reason: str | None = None
        self._finishing = 0                  # reports in flight: a racing renewal's
        self._finished = False               # rejection must not cancel a success
        self._expires_mono = sent_mono + remaining_s
        self._renew_at = sent_mono + lease_seconds / 4.0

    def __repr__(self) -> str:
        return (f"<Job {self.info.job_id} attempt {self.info.attempt_id} "
                f"{'cancelled' if self.cancelled.is_set() else 'live'}>")

    @property
    def lease_expires_at(self) -> int:
        """The lease as last confirmed by the master (UNIX seconds)."""
        return self._lease_expires_at

    @property
    def cancel_reason(self) -> str | None:
        return self._cancel_reason

    @property
    def finished(self) -> bool:
        """True once a complete or fail was applied (or rejected)."""
        return self._finished

    def complete(self, outcome_kind: str = "success", code: int | None = None,
                 uri: str | None = None, meta: dict | None = None, *,
                 artifact_receipts: list[dict] | None = None) -> ItemResult:
        """Report the job done. Safe to call again after a TransportError:
        a replay of the same report is answered ``applied``.

        Raises:
            LeaseLost: the master rejected the report (the lease was lost);
                ``cancelled`` is set too.
            APIError, TransportError: the report did not get through; the
                lease keeps being renewed, so it may be sent again.
        """
        if outcome_kind not in OUTCOME_KINDS:
            raise ValueError(f"outcome_kind must be one of {', '.join(OUTCOME_KINDS)}")
        item = self._ids()
        item["outcome"] = {"kind": outcome_kind, "code": code, "uri": uri, "meta": meta}
        if artifact_receipts:
            item["artifact_receipts"] = list(artifact_receipts)
        return self._report("complete", item)

    def fail(self, code: str, message: str, retryable: bool = True,
             details: dict | None = None) -> ItemResult:
        """Report a failure; a retryable one puts the job back in the queue.

        ``message`` is cut to the protocol's 2048 bytes rather than refused:
        it is usually ``str(exc)`` of something arbitrary. Raises as
        :meth:`complete`.
        """
        item = self._ids()
        item["retryable"] = bool(retryable)
        item["error"] = {"code": code, "message": _cut(str(message), MAX_MESSAGE_BYTES)}
        if details is not None:
            item["error"]["details"] = details
        return self._report("fail", item)

    def heartbeat(self, extend_seconds: int | None = None) -> int:
        """Renew the lease now (the queue does it on its own every quarter
        lease); returns the new ``lease_expires_at``.

        Raises:
            LeaseLost: the renewal was rejected; ``cancelled`` is set too.
        """
        seconds = extend_seconds or self.lease_seconds
        sent_mono = time.monotonic()
        result = self._reporter.extend([self], seconds)[0]
        self.renewed(result, seconds, sent_mono)
        if result.status != "applied":
            raise LeaseLost(self.info.job_id, self.info.attempt_id, result.reason(),
                            code=_code(result), job_status=result.job_status)
        return self._lease_expires_at

    # -------------------------------------------------- used by the queue

    def renewed(self, result: ItemResult, seconds: int, sent_mono: float) -> None:
        """Apply an extend-lease result (from the renewer or heartbeat)."""
        with self._lock:
            if result.status == "applied" and is_int(result.lease_expires_at):
                self._lease_expires_at = result.lease_expires_at
                self._expires_mono = sent_mono + self._reporter.remaining(
                    result.lease_expires_at, seconds)
                self._renew_at = sent_mono + seconds / 4.0
                return
            if self._finishing or self._finished:
                return  # a report is on its way or done; its own answer decides
        self.lose(f"renewal rejected: {result.reason()}")

    def retry_renewal_at(self, when: float) -> None:
        with self._lock:
            self._renew_at = when

    def schedule(self) -> tuple[float, float, bool]:
        """(renew at, expires at, report in flight) on the monotonic clock."""
        with self._lock:
            return self._renew_at, self._expires_mono, bool(self._finishing)

    def lose(self, reason: str) -> None:
        """Mark the lease lost: stop renewing and wake whoever waits on it."""
        with self._lock:
            if self._cancel_reason is None:
                self._cancel_reason = reason
        if self._tracker is not None:
            self._tracker.forget(self)
        self.cancelled.set()

    # ---------------------------------------------------------- internals

    def _ids(self) -> dict[str, Any]:
        return {"job_id": self.info.job_id, "attempt_id": self.info.attempt_id}

    def _report(self, route: str, item: dict) -> ItemResult:
        with self._lock:
            self._finishing += 1
        try:
            result = self._reporter.outcome(route, item)
        finally:
            with self._lock:
                self._finishing -= 1
        with self._lock:
            self._finished = True
        if self._tracker is not None:
            self._tracker.forget(self)
        if result.status == "applied":
            return result
        self.lose(f"{route} rejected: {result.reason()}")
        raise LeaseLost(self.info.job_id, self.info.attempt_id, result.reason(),
                        code=_code(result), job_status=result.job_status)


def _code(result: ItemResult) -> str:
    error = result.error if isinstance(result.error, dict) else {}
    return str(error.get("code") or "stale_attempt")


def _cut(text: str, limit: int) -> str:
    # "replace" also drops lone surrogates, which the master would refuse.
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")
