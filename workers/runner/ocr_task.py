"""The ``ocr`` task: one claimed derived job through OCRmyPDF to ready files.

Takes the place of the fetch ladder in ``fleethq-worker run --task ocr``
(the fetch slots run :meth:`OcrTask.run`); delivery, receipts and recovery
are the worker's usual ones (delivery.py), with the text uploaded before the
PDF. Steps:

1. ask the master for the job's source (``GET /fleet/attempts/<id>/source``):
   a fresh, short-lived URL and the source's facts. The queue holds no URL
   and no path, so nothing expires while a job waits and no host needs
   another's files;
2. check the volume has room for this source (:func:`workers.ocr.check_free_disk`);
3. download it into the attempt's work directory and check its SHA-256;
4. :func:`workers.ocr.run_ocr` with the job's languages, under the per-job
   time limit (grows with the page count) and the tree-wide memory limit;
5. move the PDF and its text into ready/ (fsync, rename, fsync the
   directory) and journal the entry ``ready``.

Failure classes (workers/ocr/errors.py) become journal entries the delivery
loop reports: permanent → ``failed`` not retryable; retryable (crash, out of
memory, time limit, cancelled) → ``failed`` retryable, so another worker may
take it; already has text → ``skipped`` (reported as done without a PDF, with the
source's own text when it could be read, so the master indexes it too);
broken worker (missing binary or language pack) → the attempt fails
retryably *and* the worker stops claiming, saying why on its heartbeat.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time

import requests

from workers.ocr import (AlreadyHasText, BrokenWorker, OcrLimits, OcrOptions, PermanentFailure,
                         RetryableFailure, check_free_disk, run_ocr)
from workers.runner.journal import Journal
from workers.sdk._errors import ProtocolError, TransportError
from workers.sdk._http import Sessions
from workers.runner.master import Master, MasterError, seg
from workers.runner.volume import Volume, fsync_dir

log = logging.getLogger("fleethq.worker")
CHUNK = 1024 * 1024
DOWNLOAD_TIMEOUT_S = 60.0


class OcrTask:
    def __init__(self, volume: Volume, journal: Journal, master: Master, *, limits: OcrLimits,
                 min_free_bytes: int, max_bytes: int, on_error=lambda text: None,
                 on_broken=lambda reason: None):
        self.volume, self.journal, self.master = volume, journal, master
        self.limits = limits
        self.min_free_bytes = min_free_bytes
        self.max_bytes = max_bytes
        self.on_error = on_error
        self.on_broken = on_broken   # the worker stops claiming (runner.py)
        # The download URL is the master's signed link or a presigned object
        # store URL: it carries its own credentials, never the bearer token.
        self._sessions = Sessions()

    def run(self, entry: dict, cancel: threading.Event, *, browser: bool = False) -> str:
        aid = entry["attempt_id"]
        started = time.monotonic()
        work = self.volume.work_dir(aid)
        try:
            outcome = self._ocr_and_keep(entry, work, cancel)
        except PermanentFailure as exc:  # the source itself, before OCR
            outcome = self._failed(entry, "invalid_pdf", exc.message, retryable=False,
                                   details={"reason": exc.reason})
        except MasterError as exc:
            # The master said no (attempt gone: 409) or did not answer: either
            # way another try may work; a gone attempt is not reported.
            gone = exc.status in (404, 409)
            outcome = self._failed(entry, "cancelled" if gone else "network", str(exc),
                                   retryable=True, reported=gone)
        except OSError as exc:
            outcome = self._failed(entry, "disk", f"{type(exc).__name__}: {exc}", retryable=True)
        except Exception as exc:  # a bug must fail the attempt, not kill the slot
            log.exception("attempt %s: unexpected error", aid)
            outcome = self._failed(entry, "internal", f"{type(exc).__name__}: {exc}", retryable=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("attempt %s (job %s) %s in %.1f s", aid, entry["job_id"], outcome,
                 time.monotonic() - started)
        return outcome

    def _ocr_and_keep(self, entry: dict, work, cancel: threading.Event) -> str:
        aid = entry["attempt_id"]
        _, source = self.master.call("GET", f"/api/v1/fleet/attempts/{seg(aid)}/source")
        disk = check_free_disk(self.volume.root, int(source["size"]), source.get("pages"),
                               reserve_bytes=self.min_free_bytes)
        if not disk.ok:
            return self._failed(entry, "disk", f"{disk.free_bytes} bytes free, this job needs "
                                f"{disk.needed_bytes}", retryable=True)
        work.mkdir(parents=True, exist_ok=True)
        local = work / "source.pdf"
        self._download(source, local, cancel)
        try:
            result = run_ocr(local, work / "ocr", source["languages"], self.limits, cancel=cancel,
                             options=OcrOptions.from_job(source.get("options")))
        except AlreadyHasText as exc:
            text = {}
            if exc.text_path is not None:  # the source's own text, for the master's index
                target = self.volume.ready / f"{aid}.txt"
                text_sha, text_size = _seal(exc.text_path, target)
                fsync_dir(self.volume.ready)
                text = {"text_file": target.name, "text_sha256": text_sha, "text_size": text_size}
            self.journal.update(aid, state="skipped", reported=False, **text,
                                outcome={"reason": "already_has_text", "pages": exc.pages})
            return f"skipped: every one of {exc.pages} pages already has text"
        except PermanentFailure as exc:
            return self._failed(entry, "invalid_pdf", exc.message, retryable=False,
                                details={"reason": exc.reason})
        except BrokenWorker as exc:
            self.on_broken(f"{exc.reason}: {exc.message}")
            return self._failed(entry, "internal", f"this worker cannot OCR: {exc.message}",
                                retryable=True, details={"reason": exc.reason})
        except RetryableFailure as exc:
            if cancel.is_set():
                self.journal.update(aid, state="failed", reported=True,
                                    error={"code": "cancelled", "message": "lease withdrawn by the master"})
                return "cancelled (no longer leased)"
            code = "timeout" if exc.reason == "time_limit" else "internal"
            return self._failed(entry, code, exc.message, retryable=True, details={"reason": exc.reason})
        pdf_target, text_target = self.volume.ready_path(aid), self.volume.ready / f"{aid}.txt"
        sha, size = _seal(result.pdf_path, pdf_target)
        text_sha, text_size = _seal(result.text_path, text_target)
        fsync_dir(self.volume.ready)
        self.journal.update(aid, state="ready", file=pdf_target.name, sha256=sha, size=size,
                            text_file=text_target.name, text_sha256=text_sha, text_size=text_size,
                            strategy="ocr", ready_at=time.time(), result={
                                "pages": result.pages, "pages_skipped": result.pages_skipped,
                                "text_chars": result.text_chars,
                                "languages": "+".join(result.languages),
                                "seconds": round(result.timings.get("total", 0.0), 1)})
        return (f"ready: {result.pages} pages, {result.text_chars} characters of text in "
                f"{result.timings.get('total', 0.0):.1f} s")

    def _download(self, source: dict, path, cancel: threading.Event) -> None:
        size = int(source["size"])
        if size > self.max_bytes:
            raise PermanentFailure("too_large", f"the source is {size} bytes (limit {self.max_bytes})")
        digest = hashlib.sha256()
        got = 0
        try:
            with self._sessions.request("GET", source["url"], stream=True,
                                        timeout=(10.0, DOWNLOAD_TIMEOUT_S)) as response:
                if response.status_code != 200:
                    raise MasterError(response.status_code, "source_unavailable",
                                      f"source download answered HTTP {response.status_code}",
                                      retryable=True)
                with open(path, "wb") as out:
                    for chunk in response.iter_content(CHUNK):
                        if cancel.is_set():
                            raise MasterError(409, "cancelled", "lease withdrawn during the download")
                        got += len(chunk)
                        if got > size:
                            break
                        digest.update(chunk)
                        out.write(chunk)
        except (TransportError, ProtocolError, requests.RequestException) as exc:  # no answer, or cut short
            self._sessions.discard()
            raise MasterError(None, "unreachable", f"source download: {exc}", retryable=True) from None
        if got != size or digest.hexdigest() != source["sha256"]:
            raise MasterError(None, "source_mismatch", f"downloaded source has {got} bytes and "
                              f"SHA-256 {digest.hexdigest()}, expected {size} and {source['sha256']}",
                              retryable=True)

    def _failed(self, entry: dict, code: str, message: str, *, retryable: bool,
                details: dict | None = None, reported: bool = False) -> str:
        self.journal.update(entry["attempt_id"], state="failed", reported=reported, error={
            "code": code, "message": (message or code)[:2048], "retryable": retryable,
            "details": details or {}})
        self.on_error(f"attempt {entry['attempt_id']}: {code}: {message}"[:2048])
        return f"failed: {code}: {message}"


def _seal(source, target) -> tuple[str, int]:
    """Move a finished file into ready/ durably; its SHA-256 and size."""
    with open(source, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        os.fsync(f.fileno())
        size = os.fstat(f.fileno()).st_size
    os.chmod(source, 0o600)
    os.replace(source, target)
    return digest, size
