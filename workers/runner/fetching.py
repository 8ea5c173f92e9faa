"""One claimed job through the fetch ladder to a ready file or a failure.

The ladder (workers.fetch) downloads into a per-attempt directory under tmp/;
the runner checks the file with the master's own PDF check, moves it into
ready/ (fsync file, rename, fsync directory) and only then journals it
``ready``. A failure is journaled ``failed`` with ``reported: false``; the
delivery loop reports it to the master.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time

from workers.wire import pdfcheck
from workers.runner.fitness import Fitness
from workers.runner.journal import Journal
from workers.wire.failures import WORKER_UNFIT
from workers.runner.volume import Volume, fsync_dir

log = logging.getLogger("fleethq.worker")

# Which failures another try may fix (sent as ``retryable`` in jobs/fail).
# - network, timeout: transient by nature.
# - challenge, throttled: the site pushing back; the master pauses the site
#   for the whole fleet and puts the job back without a reset
#   (workers.wire.failures).
# - paywall: access depends on the network the worker sits in (campus ranges,
#   institutional proxies); another worker may have it. With a lone worker the
#   job retries on it until max_resets, then ends reset_exhausted.
# - not_found, invalid_pdf, invalid_identifier: the same answer from anywhere.
# - disk, internal: this worker's problem, not the job's.
RETRYABLE = {"network": True, "timeout": True, "challenge": True, "throttled": True, "paywall": True,
             "not_found": False, "invalid_pdf": False, "invalid_identifier": False,
             "disk": True, "internal": True}


def fetch_configs(settings, user_agent: str):
    """(HTTP lanes only, full ladder or None when the browser is off)."""
    from workers.fetch import FetchConfig
    common = dict(doi_resolver=settings.doi_resolver, arxiv_base=settings.arxiv_base,
                  max_bytes=settings.max_pdf_bytes, timeout_s=settings.fetch_timeout_s,
                  max_redirects=10, user_agent=user_agent, chromium_path=settings.chromium_path,
                  allow_addresses=settings.allow_networks)
    http = FetchConfig(use_browser=False, **common)
    return http, (FetchConfig(use_browser=True, **common) if settings.use_browser else None)


NEEDS_BROWSER = "needs the browser lane"


class Fetcher:
    """Runs the ladder in two passes. The HTTP pass runs in every fetch slot;
    a job whose pages only a browser may get past (the ladder says so with
    ``details.browser == "disabled"``) goes to the browser pass, which runs in
    a few dedicated threads: the ladder keeps one Chromium per thread, and
    each costs ~300 MB, so browsers are not multiplied by the concurrency."""

    def __init__(self, volume: Volume, journal: Journal, configs, *, max_bytes: int,
                 on_error=lambda text: None, on_browser=lambda ok: None,
                 fitness: Fitness | None = None):
        self.volume, self.journal = volume, journal
        self.fitness = fitness or Fitness()
        self.http_cfg, self.browser_cfg = configs
        self.max_bytes = max_bytes
        self.on_error = on_error
        self.on_browser = on_browser   # what the browser pass learnt about Chromium's health

    def run(self, entry: dict, cancel: threading.Event, *, browser: bool = False) -> str:
        """Fetch one job; returns NEEDS_BROWSER when it must go to the browser pass."""
        aid = entry["attempt_id"]
        started = time.monotonic()
        work = self.volume.work_dir(aid)
        try:
            outcome = self._fetch_and_keep(entry, work, cancel, browser)
        except OSError as exc:
            code = "disk" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) else "internal"
            outcome = self._failed(entry, code, f"{type(exc).__name__}: {exc}", {})
        except Exception as exc:  # a bug must fail the attempt, not kill the slot
            log.exception("attempt %s: unexpected error", aid)
            outcome = self._failed(entry, "internal", f"{type(exc).__name__}: {exc}", {})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("attempt %s (job %s) %s in %.1f s", aid, entry["job_id"], outcome,
                 time.monotonic() - started)
        return outcome

    def _fetch_and_keep(self, entry: dict, work, cancel: threading.Event, browser: bool) -> str:
        from workers.fetch import fetch_document
        aid = entry["attempt_id"]
        result = None
        if not cancel.is_set():  # a job may wait for the browser pass long enough to be cancelled
            result = fetch_document(entry["value"], str(work),
                                    self.browser_cfg if browser else self.http_cfg)
        if (result is not None and not browser and not result.ok and self.browser_cfg is not None
                and result.details.get("browser") == "disabled" and not cancel.is_set()):
            return NEEDS_BROWSER
        if browser and result is not None:
            self.on_browser(not str(result.details.get("browser", "")).startswith("unavailable"))
        if cancel.is_set():
            # The master no longer leases this attempt (heartbeat): a result now
            # would only be refused or would displace a newer attempt.
            self.journal.update(aid, state="failed", reported=True,
                                error={"code": "cancelled", "message": "lease withdrawn by the master"})
            return "cancelled (no longer leased)"
        if not result.ok:
            return self._failed(entry, result.error_code or "internal", result.message,
                                result.details, strategy=result.strategy)
        try:
            # The ladder already ran the master's full check (structural parse
            # in a child process, DESIGN §8 step 4) on this file. Repeating the
            # cheap part (size, head, tail, SHA-256: ~1 ms/MiB) ties what gets
            # journaled to the bytes on disk without paying for a second parse.
            info = pdfcheck.check_pdf_file(result.path, max_bytes=self.max_bytes,
                                           expected_size=result.size,
                                           expected_sha256=result.sha256, parse=False)
        except pdfcheck.PdfRejected as exc:
            return self._failed(entry, "invalid_pdf", str(exc), {"reason": exc.reason},
                                strategy=result.strategy)
        except pdfcheck.PdfCheckError as exc:
            return self._failed(entry, "internal", f"PDF check unavailable: {exc}", {})
        target = self.volume.ready_path(aid)
        fd = os.open(result.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(result.path, 0o600)
        os.replace(result.path, target)
        fsync_dir(self.volume.ready)
        self.journal.update(aid, state="ready", file=target.name, sha256=info.sha256,
                            size=info.size, source_url=(result.source_url or "")[:4096],
                            strategy=result.strategy, ready_at=time.time(),
                            result=_small(result.details))
        for held in self.fitness.succeeded():    # those failures were the sites': report them
            self.journal.update(held, hold_since=None)
        return f"ready: {info.size} bytes via {result.strategy}"

    def _failed(self, entry: dict, code: str, message: str, details: dict, *,
                strategy: str | None = None) -> str:
        retryable = RETRYABLE.get(code, True)
        aid = entry["attempt_id"]
        hold, convicted = self.fitness.failed(aid, code, details or {})
        self.journal.update(aid, state="failed", reported=False, error={
            "code": code, "message": (message or code)[:2048], "retryable": retryable,
            "details": _small({**(details or {}), **({"strategy": strategy} if strategy else {})})},
            hold_since=time.time() if hold else None)
        for held in convicted:
            self._not_the_jobs_fault(held)
        self.on_error(f"attempt {aid}: {code}: {message}"[:2048])
        return f"failed: {code}: {message}" + (" (held: this worker may be the problem)" if hold else "")

    def _not_the_jobs_fault(self, aid: str) -> None:
        """A held failure the worker turned out to cause: report it as
        ``worker_unfit`` (the master charges the job no reset)."""
        entry = self.journal.get(aid)
        if entry is None or entry.get("state") != "failed" or entry.get("reported", True):
            return
        error = entry.get("error") or {}
        self.journal.update(aid, hold_since=None, error={
            "code": WORKER_UNFIT, "retryable": True,
            "message": f"this worker stopped claiming: {self.fitness.reason} (the job did nothing wrong; "
                       f"it saw {error.get('code')}: {error.get('message')})"[:2048],
            "details": {**(error.get("details") or {}), "observed": error.get("code")}})


def _small(details: dict, limit: int = 4096) -> dict:
    """Details kept in the journal and sent to the master stay small (the fail
    route takes 8 KiB, X-Download-Result 16 KiB)."""
    import json
    try:
        encoded = json.dumps(details or {}, default=str)
    except (TypeError, ValueError):
        return {}
    if len(encoded) <= limit:
        return json.loads(encoded)
    # Too big to carry whole: keep the small top-level fields, name the rest.
    kept = {k: v for k, v in details.items() if len(json.dumps(v, default=str)) <= 256}
    kept["truncated"] = sorted(k for k in details if k not in kept)[:32]
    return kept if len(json.dumps(kept, default=str)) <= limit else {"truncated": True}
