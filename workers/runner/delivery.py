"""Deliver what the journal holds: upload ready files, wait for their archive
receipt, delete on ``done``, report failures (DESIGN §7 uploads, §8, §9).

Upload answers:
    202 staged      → ``uploaded``; wait for the receipt (long-poll)
    200 done        → check the receipt, delete the file
    409             → stale (the attempt moved on, or another file was sent): drop
    422 / 413       → the master refuses the file for good: report invalid_pdf, delete
    507 / 503 / 5xx / 429 / no answer → try the same attempt again later
                      (Retry-After when given, else backoff up to 60 s)
A file is deleted only on a ``done`` receipt for this attempt with the same
SHA-256 and size. Ready files older than the retention (24 h) are dropped
with a log line.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
import time

from workers.runner.journal import Journal
from workers.runner.master import RETRY, Master, MasterError, Refused, seg
from workers.runner.volume import Volume
from workers.runner.fitness import HOLD_S
from workers.wire.failures import NOT_THE_JOBS_FAULT

log = logging.getLogger("fleethq.worker")

RECEIPT_WAIT_MS = 10_000
RECEIPT_ROUND_S = 30.0     # then the slot is handed back and the entry re-queued
UPLOAD_TIMEOUT_S = 300.0   # read timeout; the master's own upload budget is 10..600 s
MAX_RESULT_HEADER = 6000


class Delivery:
    def __init__(self, volume: Volume, journal: Journal, master: Master, *, worker_id: str,
                 retention_s: float, on_error=lambda text: None, wake=lambda: None):
        self.volume, self.journal, self.master = volume, journal, master
        self.worker_id = worker_id
        self.retention_s = retention_s
        self.on_error = on_error
        self.wake = wake
        self._lock = threading.Lock()
        self._busy: set[str] = set()
        self._not_before: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self.paused_until = 0.0   # set while the master is unreachable: no hammering

    # --- scheduling ----------------------------------------------------------

    def due(self) -> list[tuple[str, str]]:
        """(attempt, lane) with something to do now, oldest first; marks them
        busy. Lane ``receipt`` is a wait for the archive receipt, ``send`` an
        upload or a failure report: separate thread pools, so that files
        waiting for the archive never hold up the next uploads."""
        now = time.monotonic()
        if now < self.paused_until:
            return []
        picked = []
        entries = self.journal.entries("ready", "uploaded", "failed", "skipped")
        entries.sort(key=lambda e: e["updated_at"])
        with self._lock:
            for entry in entries:
                aid = entry["attempt_id"]
                if entry["state"] in ("failed", "skipped") and entry.get("reported", True):
                    continue
                if entry.get("hold_since") and time.time() - entry["hold_since"] < HOLD_S:
                    continue    # a failure that may be this worker's own: fitness.py decides
                if aid in self._busy or self._not_before.get(aid, 0) > now:
                    continue
                self._busy.add(aid)
                picked.append((aid, "receipt" if entry["state"] == "uploaded" else "send"))
        return picked

    def handle(self, aid: str) -> None:
        """Move one attempt forward. Raises Refused (the runner stops)."""
        try:
            entry = self.journal.get(aid)
            if entry is None:
                return
            if entry["state"] in ("ready", "uploaded") and self._too_old(entry):
                return
            if entry["state"] == "ready":
                self._upload(entry)
            elif entry["state"] == "uploaded":
                self._await_receipt(entry)
            elif entry["state"] == "failed" and not entry.get("reported", True):
                self._report(entry)
            elif entry["state"] == "skipped" and not entry.get("reported", True):
                self._report_skip(entry)
            self._failures.pop(aid, None)
        except Refused:
            raise
        except MasterError as exc:
            self._retry_later(aid, exc)
        finally:
            with self._lock:
                self._busy.discard(aid)

    def _retry_later(self, aid: str, exc: MasterError) -> None:
        count = self._failures.get(aid, 0) + 1
        self._failures[aid] = count
        # The one retry policy of the worker side (workers/sdk/_retry.py): its
        # backoff is short (at most 10 s), so a returning master gets its files
        # fast; the pause below keeps an unreachable master to one probe per
        # window. A Retry-After longer than the policy takes is waited out: the
        # file must get there.
        wait = RETRY.pause(count, exc.retry_after_s,
                           server_error=exc.status is not None and exc.status >= 500)
        if wait is None:
            wait = exc.retry_after_s
        self._not_before[aid] = time.monotonic() + wait
        if exc.status is None:
            # Nothing answers: hold every delivery briefly instead of one
            # timeout per file; the files stay on the volume meanwhile.
            self.paused_until = time.monotonic() + min(wait, 10.0)
        log.warning("attempt %s: delivery deferred %.1f s: %s", aid, wait, exc)
        self.on_error(f"attempt {aid}: {exc}"[:2048])

    # --- steps ---------------------------------------------------------------

    def _upload(self, entry: dict) -> None:
        aid = entry["attempt_id"]
        headers = {"X-Download-Strategy": entry.get("strategy") or "direct"}
        if entry.get("source_url"):
            headers["X-Source-URL"] = entry["source_url"]
        if entry.get("result"):
            raw = json.dumps(entry["result"], separators=(",", ":")).encode()
            encoded = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
            # The master takes 16 KiB, but a front server may not: gunicorn's
            # default header limit is 8190 bytes. A result is a nicety, the
            # upload is not: send it only when it surely fits.
            if len(encoded) <= MAX_RESULT_HEADER:
                headers["X-Download-Result"] = encoded
        # A derived PDF's text goes first (the master wants it so).
        if entry.get("text_file") and not self._upload_text(entry):
            return
        path = self.volume.ready / entry["file"]
        started = time.monotonic()
        try:
            status, receipt = self.master.upload(aid, path, sha256=entry["sha256"], size=entry["size"],
                                                 extra_headers=headers, timeout=UPLOAD_TIMEOUT_S)
        except MasterError as exc:
            if exc.status in (409, 404):
                return self._drop(entry, "stale", f"upload refused: {exc.message}")
            if exc.status in (413, 422):
                return self._refused_file(entry, exc)
            if exc.status == 400 and not exc.retryable:
                return self._drop(entry, "internal", f"upload rejected: {exc.message}", report=True)
            raise
        log.info("attempt %s: uploaded %d bytes in %.2f s (%s)", aid, entry["size"],
                 time.monotonic() - started, receipt.get("state"))
        if receipt.get("state") == "done":
            return self._check_done(entry, receipt)
        self.journal.update(aid, state="uploaded", result=None)  # sent; keeps the journal small
        self.wake()  # the receipt wait is the receipt pool's job

    def _send_text(self, entry: dict) -> None:
        aid = entry["attempt_id"]
        data = (self.volume.ready / entry["text_file"]).read_bytes()
        if len(data) != entry["text_size"]:
            raise OSError(f"text file of attempt {aid} changed size since it was journaled")
        self.master.call("PUT", f"/api/v1/fleet/uploads/{seg(aid)}/text", data=data,
                         headers={"Content-Type": "text/plain; charset=utf-8",
                                  "X-Text-SHA256": entry["text_sha256"]},
                         timeout=UPLOAD_TIMEOUT_S)

    def _upload_text(self, entry: dict) -> bool:
        """PUT the entry's text; False when the master refused it for good."""
        try:
            self._send_text(entry)
        except MasterError as exc:
            if exc.status in (409, 404):
                self._drop(entry, "stale", f"text upload refused: {exc.message}")
                return False
            if exc.status in (413, 422):
                self._refused_file(entry, exc)
                return False
            raise
        return True

    def _await_receipt(self, entry: dict) -> None:
        aid = entry["attempt_id"]
        until = time.monotonic() + RECEIPT_ROUND_S
        while time.monotonic() < until:
            try:
                _, receipt = self.master.call(
                    "GET", f"/api/v1/fleet/receipts/{seg(aid)}?wait_ms={RECEIPT_WAIT_MS}",
                    timeout=RECEIPT_WAIT_MS / 1000 + 30)
            except MasterError as exc:
                if exc.status == 404:  # no upload on record: send it again
                    self.journal.update(aid, state="ready")
                    return
                raise
            state = receipt.get("state")
            if state == "done":
                return self._check_done(entry, receipt)
            if state in ("failed", "expired", "held"):  # held: revoked, kept by the master
                return self._drop(entry, "archive_" + state,
                                  f"receipt {state}: {receipt.get('error')}")
        self._not_before[aid] = time.monotonic() + 1.0  # staged a while: give others a turn

    def _check_done(self, entry: dict, receipt: dict) -> None:
        aid = entry["attempt_id"]
        if (str(receipt.get("attempt_id")) != aid or receipt.get("sha256") != entry["sha256"]
                or receipt.get("size") != entry["size"]):
            # Never delete on a receipt that is not about exactly this file.
            self._not_before[aid] = time.monotonic() + 600
            text = (f"attempt {aid}: done receipt does not match the file "
                    f"({receipt.get('sha256')}/{receipt.get('size')} vs "
                    f"{entry['sha256']}/{entry['size']}); file kept")
            log.error("%s", text)
            self.on_error(text)
            return
        self.journal.update(aid, state="done", asset_key=receipt.get("asset_key"), result=None)
        self._remove_files(entry)
        log.info("attempt %s (job %s): archived as %s; file deleted", aid, entry["job_id"],
                 receipt.get("asset_key"))

    def _refused_file(self, entry: dict, exc: MasterError) -> None:
        reason = exc.details.get("reason") if exc.details else None
        self.journal.update(entry["attempt_id"], state="failed", reported=False, error={
            "code": "invalid_pdf", "message": f"master refused the upload: {exc.message}"[:2048],
            "retryable": False, "details": {"reason": reason, "status": exc.status}})
        self._remove_files(entry)
        self.on_error(f"attempt {entry['attempt_id']}: upload refused: {exc.message}"[:2048])
        self._report(self.journal.get(entry["attempt_id"]))

    def _drop(self, entry: dict, code: str, message: str, *, report: bool = False) -> None:
        self.journal.update(entry["attempt_id"], state="failed", reported=not report, error={
            "code": code, "message": message[:2048], "retryable": True})
        self._remove_files(entry)
        log.warning("attempt %s (job %s): dropped: %s", entry["attempt_id"], entry["job_id"], message)
        if report:
            self._report(self.journal.get(entry["attempt_id"]))

    def _remove_files(self, entry: dict) -> None:
        for name in (entry.get("file"), entry.get("text_file")):
            if name:
                (self.volume.ready / name).unlink(missing_ok=True)

    def _report_skip(self, entry: dict) -> None:
        """A derived job whose input needs no work: done without a PDF; the
        source's own text, if the task read it, goes first for the index."""
        outcome = entry.get("outcome") or {}
        body = {"reason": outcome.get("reason", "already_has_text")}
        if isinstance(outcome.get("pages"), int):
            body["pages"] = outcome["pages"]
        if entry.get("text_file") and (self.volume.ready / entry["text_file"]).exists():
            try:
                self._send_text(entry)
            except MasterError as exc:
                if exc.status not in (404, 409, 413, 422):
                    raise
                # The skip itself still counts; only the index misses this text.
                log.warning("attempt %s: text of the skipped source refused: %s",
                            entry["attempt_id"], exc.message)
        try:
            self.master.call("POST", f"/api/v1/fleet/attempts/{seg(entry['attempt_id'])}/skip",
                             body=body)
            result = "done"
        except MasterError as exc:
            if exc.status not in (404, 409):
                raise
            result = f"not needed: {exc.code}"
        self.journal.update(entry["attempt_id"], reported=True)
        self._remove_files(entry)
        log.info("attempt %s (job %s): reported skipped (%s): %s", entry["attempt_id"],
                 entry["job_id"], body["reason"], result)

    def _too_old(self, entry: dict) -> bool:
        age = time.time() - (entry.get("ready_at") or entry["created_at"])
        if age <= self.retention_s:
            return False
        self._drop(entry, "expired_local", f"ready file kept {_span(age)} without an archive "
                   f"receipt (limit {_span(self.retention_s)})")
        return True

    def _report(self, entry: dict) -> None:
        error = entry["error"]
        code = error["code"] if error["code"] in FAIL_CODES else "internal"
        # The journal keeps ids as text (volumes written by older versions
        # too); the wire wants an integer job id.
        item = {"job_id": int(entry["job_id"]), "attempt_id": entry["attempt_id"],
                "retryable": bool(error.get("retryable", True)),
                "error": {"code": code, "message": error.get("message") or code}}
        if error.get("details"):
            item["error"]["details"] = error["details"]
        try:
            _, answer = self.master.call("POST", f"/api/v1/projects/{seg(entry['project'])}/jobs/fail",
                                         body={"worker_id": self.worker_id, "items": [item]})
            result = (answer.get("results") or [{}])[0]
            outcome = f"{result.get('status')} (job {result.get('job_status')})"
        except MasterError as exc:
            if exc.status not in (404, 409):  # project gone / not ours any more: nothing to tell
                raise
            outcome = f"not needed: {exc.code}"
        self.journal.update(entry["attempt_id"], reported=True)
        log.info("attempt %s (job %s): reported %s (retryable=%s): %s", entry["attempt_id"],
                 entry["job_id"], code, item["retryable"], outcome)


# What the worker reports as it is; anything else (a bug's code) as internal.
FAIL_CODES = ("network", "timeout", "not_found", "paywall", "invalid_pdf", "disk",
              "internal", "invalid_identifier", "cancelled", *sorted(NOT_THE_JOBS_FAULT))


def _span(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 7200 else f"{seconds:.0f} s"
