"""Receive one upload (DESIGN §8 steps 1–5): admit, reserve, stream, verify, stage.

The body is streamed into the spool in 1 MiB chunks while hashing; nothing
holds the PDF in memory. No database connection is held while bytes flow:
admission commits before streaming starts, staging opens a new transaction.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass

from werkzeug.exceptions import ClientDisconnected

from app.errors import InvalidRequest, InvalidUpload, StaleUpload, TooLarge, VerificationUnavailable
from app.extensions import db
from app.storage.base import StorageError
from app.uploads import derived as derived_uploads
from app.uploads import spool as spool_mod
from app.uploads import transitions
from workers.wire import pdfcheck
from workers.wire.protocol import strict_json_loads

log = logging.getLogger(__name__)
_SHA256 = re.compile(r"\A[0-9a-f]{64}\Z")
CHUNK = 1024 * 1024
MAX_RESULT_BYTES = 16 * 1024


@dataclass(frozen=True)
class UploadHeaders:
    sha256: str
    size: int
    source_url: str | None
    download_strategy: str | None
    download_result: dict | None


def parse_headers(headers, content_length: int | None, *, max_bytes: int) -> UploadHeaders:
    """Everything that can be refused before a byte of the body is read."""
    sha = (headers.get("X-PDF-SHA256") or "").lower()
    if not _SHA256.match(sha):
        raise InvalidRequest("X-PDF-SHA256 must be 64 hex digits", details={"field": "X-PDF-SHA256"})
    raw_size = headers.get("X-PDF-Size") or ""
    if not (raw_size.isascii() and raw_size.isdigit()) or len(raw_size) > 15:
        raise InvalidRequest("X-PDF-Size must be a decimal byte count", details={"field": "X-PDF-Size"})
    size = int(raw_size)
    if size > max_bytes or (content_length is not None and content_length > max_bytes):
        raise TooLarge(f"uploads are limited to {max_bytes} bytes", details={"limit": max_bytes})
    if content_length is None or content_length != size:
        raise InvalidRequest("Content-Length must be present and equal X-PDF-Size",
                             details={"field": "Content-Length"})
    result = None
    if headers.get("X-Download-Result"):
        encoded = headers["X-Download-Result"]
        try:
            decoded = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            if len(decoded) > MAX_RESULT_BYTES:
                raise ValueError("too long")
            result = strict_json_loads(decoded)
            if not isinstance(result, dict):
                raise ValueError("not an object")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise InvalidRequest("X-Download-Result must be base64url JSON object of at most 16 KiB",
                                 details={"field": "X-Download-Result"}) from None
    source = headers.get("X-Source-URL")
    strategy = headers.get("X-Download-Strategy")
    for name, value in (("X-Source-URL", source), ("X-Download-Strategy", strategy)):
        if value is not None and len(value) > 4096:
            raise InvalidRequest(f"{name} is too long", details={"field": name})
    return UploadHeaders(sha, size, source, strategy, result)


def stream_to(fd: int, stream, size: int, deadline: float, sock) -> str:
    """Copy exactly ``size`` bytes from ``stream`` to ``fd``; returns the SHA-256.

    Raises:
        TimeoutError: the upload budget ran out.
        ConnectionError: the client went away early.
    """
    digest = hashlib.sha256()
    left = size
    while left > 0:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("upload budget exhausted")
        if sock is not None:
            sock.settimeout(min(remaining, 60.0))
        try:
            chunk = stream.read(min(CHUNK, left))
        except TimeoutError:
            raise TimeoutError("upload budget exhausted") from None
        except ClientDisconnected:  # werkzeug's server: short body or read timeout
            raise ConnectionError("client closed the upload early") from None
        if not chunk:
            raise ConnectionError("client closed the upload early")
        digest.update(chunk)
        os.write(fd, chunk)
        left -= len(chunk)
    return digest.hexdigest()


def _released_meanwhile() -> StaleUpload:
    # The file vanished under the pipeline: a newer upload of the same
    # attempt superseded this one (its admission drops earlier part files),
    # or the upload was held (its worker revoked) and an admin released it.
    return StaleUpload("the upload's file was removed while it streamed: a newer upload of this "
                       "attempt superseded it, or an admin released it")


def _without_paths(exc: Exception, part: str, spool) -> str:
    """An error's text for the uploader: the master's file and spool paths
    are none of its business."""
    return str(exc).replace(part, "the file").replace(spool.directory, "the spool")


def _discard(attempt_id: int, generation: int, location: str, spool) -> None:
    """Remove an admitted upload's file, unless its worker's revocation put
    the upload on hold: then the file is kept for an admin (DESIGN §8.7),
    with s3 staging in the store, where any instance can serve it."""
    try:
        if transitions.keep_if_held(attempt_id, generation, location):
            log.warning("upload of a revoked worker held",
                        extra={"attempt_id": attempt_id, "path": location})
            kept = spool.keep(location, attempt_id, generation)
            if kept != location and not transitions.keep_if_held(attempt_id, generation, kept):
                spool.remove(kept)  # released meanwhile
            return
    except Exception:  # noqa: BLE001 - the database decides later
        # Without the database we cannot tell: leave the file to the spool
        # sweeper, which removes it unless the upload is held.
        db.session.rollback()
        log.exception("could not look up upload %s; its file is left to the sweeper", attempt_id)
        return
    spool.remove(location)


def receive(attempt_id: int, worker, meta: UploadHeaders, stream, sock, spool, *,
            min_bytes: int, max_bytes: int, parse_limits: pdfcheck.ParseLimits) -> tuple[int, dict]:
    """Run the upload pipeline. Returns (HTTP status, receipt-like state)."""
    started = time.monotonic()
    # A derived job's PDF needs its text first: refused before admission,
    # so nothing is reserved or changed.
    rules = derived_uploads.rules_for(attempt_id)
    if rules is not None:
        min_bytes = rules.min_bytes
    admission = transitions.admit(attempt_id, worker, meta.sha256, meta.size, spool)
    if admission.action == "receipt":
        return (200 if admission.state == "done" else 202), {"state": admission.state}
    if meta.size < min_bytes:
        # Refused before reading the body, but like every permanent problem it
        # fails the attempt so the job goes back to the queue at once.
        message = f"a PDF must be at least {min_bytes} bytes"
        transitions.reject(attempt_id, admission.generation,
                           {"code": "invalid_pdf", "message": message, "reason": "too_small"})
        raise InvalidUpload(message, details={"reason": "too_small"})
    deadline = time.monotonic() + admission.deadline_s
    generation = admission.generation
    part, fd = spool.create_exclusive(attempt_id, generation)
    spool.drop_superseded_parts(attempt_id, generation)
    try:
        try:
            digest = stream_to(fd, stream, meta.size, deadline, sock)
            # Taken at the last write: a later write (before or after staging)
            # changes it, and the archive commit then re-reads the file.
            written = spool_mod.stamp(fd)
        finally:
            os.close(fd)
    except (TimeoutError, ConnectionError, OSError) as exc:
        _discard(attempt_id, generation, part, spool)
        # The attempt stays uploading: a retry gets a new generation, and
        # reserves the spool again.
        try:
            transitions.interrupted(attempt_id, generation)
        except Exception:  # noqa: BLE001 - the sweeper frees it when the budget ends
            db.session.rollback()
            log.exception("could not free the reservation of interrupted upload %s", attempt_id)
        # An OSError's text may name the spool file: its reason only.
        err = InvalidRequest(f"upload interrupted: {getattr(exc, 'strerror', None) or exc}")
        err.retryable = True
        raise err from None
    except BaseException:
        _discard(attempt_id, generation, part, spool)
        raise
    streamed = time.monotonic()
    try:
        if digest != meta.sha256:
            raise pdfcheck.PdfRejected("hash_mismatch", "SHA-256 of the body differs from X-PDF-SHA256")
        info = pdfcheck.check_pdf_file(part, min_bytes=min_bytes, max_bytes=max_bytes,
                                       expected_size=meta.size, limits=parse_limits,
                                       known_sha256=digest)
        if rules is not None:
            rules.check(info)
    except FileNotFoundError:
        raise _released_meanwhile() from None
    except pdfcheck.PdfCheckError as exc:
        _discard(attempt_id, generation, part, spool)
        raise VerificationUnavailable(f"could not verify the upload: {_without_paths(exc, part, spool)}",
                                      retry_after_ms=5000) from None
    except pdfcheck.PdfRejected as exc:
        if not os.path.exists(part):  # the parser found no file: not the file's fault
            raise _released_meanwhile() from None
        message = _without_paths(exc, part, spool)
        transitions.reject(attempt_id, generation,
                           {"code": "invalid_pdf", "message": message, "reason": exc.reason})
        _discard(attempt_id, generation, part, spool)
        raise InvalidUpload(message, details={"reason": exc.reason}) from None
    verified = time.monotonic()
    try:
        final = spool.publish(part, attempt_id, generation, digest, meta.size)
    except FileNotFoundError:
        raise _released_meanwhile() from None
    except StorageError as exc:
        # s3 staging: the store is down. The attempt stays uploading and the
        # worker's retry (a new generation) streams it again; nothing staged.
        _discard(attempt_id, generation, part, spool)
        raise VerificationUnavailable(f"could not stage the upload: {exc}",
                                      retry_after_ms=5000) from None
    if spool_mod.in_store(final):
        written = None  # the archive copies inside the store; no local file to stamp
    staged = transitions.stage(attempt_id, generation, final, written, {
        "source_url": meta.source_url, "download_strategy": meta.download_strategy,
        "download_result": meta.download_result, "pages": info.pages})
    if not staged:
        _discard(attempt_id, generation, final, spool)
        raise StaleUpload("a newer upload of this attempt, or a change of the attempt, won")
    done = time.monotonic()
    log.info("upload staged", extra={
        "attempt_id": attempt_id, "size": meta.size,
        "timings_ms": {"admit_and_stream": round((streamed - started) * 1000),
                       "verify": round((verified - streamed) * 1000),
                       "seal_stage": round((done - verified) * 1000)}})
    return 202, {"state": "staged"}
