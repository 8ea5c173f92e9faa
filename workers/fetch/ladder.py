"""The fetch ladder: direct PDF → landing page → browser → classified failure.

Each lane gets its own ``cfg.timeout_s`` budget (the two HTTP lanes share
one, the browser lane has another), so a document costs at most about twice
the timeout plus the PDF checks. The browser is only tried when the HTTP
lanes ended on a page (no PDF link, paywall or challenge): it cannot help
with a 404, a timeout, a refused address or a broken PDF, and it is the
expensive lane.
"""
from __future__ import annotations

import logging
import os
import time
from typing import NamedTuple
from urllib.parse import quote

from workers.sdk._retry import retry_after_s
from workers.wire.canonical import InvalidIdentifier, classify

from . import browser, store
from .classify import classify_page
from .landing import MAX_HTML_BYTES, decode_html, pdf_links
from .safe_http import SafeClient
from .types import (CHALLENGE, DISK, FetchFailure, FetchResult, INTERNAL, INVALID_IDENTIFIER,
                    INVALID_PDF, NETWORK, NOT_FOUND, PAYWALL, THROTTLED, TIMEOUT)

log = logging.getLogger("workers.fetch")

MAX_LINKS_TRIED = 3          # per landing page; the best-ranked links come first
SOFT = (PAYWALL, CHALLENGE)


def target_url(value: str, cfg) -> str:
    """The first URL to fetch for a job value (URL, DOI or arXiv id)."""
    ident = classify(value)
    if ident.kind == "doi":
        return cfg.doi_resolver + quote(ident.normalized, safe="/:;()._-~<>[]")
    if ident.kind == "arxiv":
        base = cfg.arxiv_base if cfg.arxiv_base.endswith("/") else cfg.arxiv_base + "/"
        return f"{base}pdf/{ident.normalized}" + (f"v{ident.version}" if ident.version else "")
    return ident.normalized


def fetch_document(value: str, dest_dir: str, cfg) -> FetchResult:
    """Fetch one document into ``dest_dir``; never raises for fetch problems."""
    try:
        url = target_url(value, cfg)
    except InvalidIdentifier as exc:
        return FetchResult(False, error_code=INVALID_IDENTIFIER, message=str(exc))
    try:
        os.makedirs(dest_dir, exist_ok=True)
    except OSError as exc:
        return FetchResult(False, error_code=DISK, message=f"cannot create {dest_dir}: {exc}")
    lanes: list[dict] = []
    started = time.monotonic()
    try:
        return _success(*http_lanes(url, dest_dir, cfg), lanes, started)
    except FetchFailure as exc:
        http_failure = exc
    except Exception as exc:   # a bug must fail the job, not kill the worker thread
        log.exception("HTTP lanes crashed on %s", url)
        http_failure = FetchFailure(INTERNAL, f"HTTP lanes crashed: {type(exc).__name__}: {exc}")
    lanes.append(_lane_record("http", http_failure, started))

    if not _browser_may_help(http_failure):
        return _failure(http_failure, lanes, url)
    if not cfg.use_browser:
        return _failure(http_failure, lanes, url, browser="disabled")
    started_browser = time.monotonic()
    try:
        return _success(*browser.fetch_with_browser(url, dest_dir, cfg), lanes, started)
    except browser.BrowserUnavailable as exc:
        lanes.append(_lane_record("browser", exc, started_browser))
        return _failure(http_failure, lanes, url, browser=f"unavailable: {exc.message}",
                        retry_with_browser=True)
    except FetchFailure as exc:
        browser_failure = exc
    except Exception as exc:
        log.exception("browser lane crashed on %s", url)
        browser_failure = FetchFailure(INTERNAL, f"browser lane crashed: {type(exc).__name__}: {exc}")
    lanes.append(_lane_record("browser", browser_failure, started_browser))
    # The browser saw the rendered page, so its verdict usually wins; but its
    # own breakdowns (crash, time out) must not hide what the HTTP lanes learnt.
    if browser_failure.code in (TIMEOUT, NETWORK, INTERNAL) and http_failure.code in SOFT \
            and not browser_failure.details.get("blocked"):
        return _failure(http_failure, lanes, url, browser=browser_failure.message)
    return _failure(browser_failure, lanes, url, strategy="browser")


def _browser_may_help(failure: FetchFailure) -> bool:
    if failure.details.get("blocked") or failure.details.get("http_status") in (404, 410):
        return False
    return failure.code in (PAYWALL, CHALLENGE, NOT_FOUND)


def _lane_record(lane: str, failure: FetchFailure, started: float) -> dict:
    return {"lane": lane, "error_code": failure.code, "message": failure.message[:300],
            "elapsed_ms": round((time.monotonic() - started) * 1000)}


def _success(path, info, source_url, strategy, extra, lanes, started) -> FetchResult:
    details = {"lanes": lanes, "pages": info.pages, "pdf_version": info.pdf_version,
               "elapsed_ms": round((time.monotonic() - started) * 1000), **extra}
    return FetchResult(True, path=path, sha256=info.sha256, size=info.size, source_url=source_url,
                       strategy=strategy, message=f"fetched {info.size} bytes via {strategy}",
                       details=details)


def _failure(exc: FetchFailure, lanes, url, strategy=None, **extra) -> FetchResult:
    details = {**exc.details, "lanes": lanes, "target_url": url, **extra}
    strategy = strategy or ("landing" if details.get("via_landing") else "direct")
    return FetchResult(False, strategy=strategy, error_code=exc.code, message=exc.message,
                       details=details)


# --- the HTTP lanes ----------------------------------------------------------

def http_lanes(url: str, dest_dir: str, cfg):
    """Direct PDF, else the landing page's PDF links. Returns what _success takes."""
    deadline = time.monotonic() + cfg.timeout_s
    with SafeClient(cfg) as client:
        got = _pdf_or_page(client, url, dest_dir, cfg, deadline)
        extra = {"redirects": got.response.redirects}
        if got.html is None:
            return got.path, got.info, got.response.url, "direct", extra
        page_url = got.response.url
        path, info, source = _landing(client, page_url, got.html, dest_dir, cfg, deadline, 0, set())
        return path, info, source, "landing", {**extra, "landing_url": page_url}


class _Got(NamedTuple):
    """What one request gave: a saved PDF (``path``, ``info``) or a page's ``html``."""
    response: object
    path: str | None = None
    info: object = None
    html: str | None = None


def _pdf_or_page(client, url, dest_dir, cfg, deadline) -> _Got:
    """Request ``url``: save it if it is a PDF, read it (capped) if it is a web
    page; raise for anything else and for an error page."""
    response = client.request(url, deadline=deadline)
    try:
        kind = _kind(response)
        if kind == "pdf":
            path, info = store.save_response(response, dest_dir, cfg.max_bytes)
            return _Got(response, path, info)
        body, _cut = response.read_capped(MAX_HTML_BYTES)
    finally:
        response.close()
    _refuse_non_pages(kind, response)
    html = decode_html(body, response.headers)
    if response.status >= 400:
        raise classify_page(response.status, html, response.url,
                            retry_after_s(None, response.headers.get("Retry-After")))
    return _Got(response, html=html)


def _kind(response) -> str:
    if response.status >= 400:
        return "error"
    head = response.peek(1024)
    if 200 <= response.status < 300 and store.looks_pdf(head):
        return "pdf"
    if store.declared_pdf(response.headers):
        return "fake_pdf"
    ctype = response.content_type()
    if "html" in ctype or "xml" in ctype or head.lstrip()[:1] == b"<":
        return "html"
    return "other"


def _refuse_non_pages(kind: str, response) -> None:
    if kind == "fake_pdf":
        raise FetchFailure(INVALID_PDF, f"{response.url} is served as a PDF but is not one"
                           f" ({response.content_type() or 'no type'})",
                           reason="not_pdf", url=response.url)
    if kind == "other":
        raise FetchFailure(INVALID_PDF, f"{response.url} is neither a PDF nor a web page"
                           f" ({response.content_type() or 'no type'})",
                           reason="not_pdf", url=response.url)


def _landing(client, page_url, html, dest_dir, cfg, deadline, depth, tried):
    failures = []
    for link in [u for u in pdf_links(html, page_url) if u not in tried][:MAX_LINKS_TRIED]:
        tried.add(link)
        try:
            return _follow_link(client, link, dest_dir, cfg, deadline, depth, tried)
        except FetchFailure as exc:
            if exc.code in (TIMEOUT, DISK, INTERNAL):
                raise           # the budget is gone or the worker has a problem: stop here
            exc.details["via_landing"] = True
            failures.append(exc)
    page = classify_page(200, html, page_url)
    return _raise_best(failures, page)


def _follow_link(client, link, dest_dir, cfg, deadline, depth, tried):
    got = _pdf_or_page(client, link, dest_dir, cfg, deadline)
    if got.html is None:
        return got.path, got.info, got.response.url
    if depth >= 1:     # a viewer page inside a landing page is as deep as publishers go
        raise classify_page(200, got.html, got.response.url)
    return _landing(client, got.response.url, got.html, dest_dir, cfg, deadline, depth + 1, tried)


def _raise_best(failures: list[FetchFailure], page: FetchFailure):
    """Pick the most telling failure of a landing page whose links all failed."""
    def first(pred):
        return next((f for f in failures if pred(f)), None)
    chosen = (first(lambda f: f.details.get("blocked"))
              or first(lambda f: f.code == THROTTLED)      # the site pushed back: say so
              or first(lambda f: f.code == INVALID_PDF)
              or first(lambda f: f.code in SOFT)
              or (page if page.code in SOFT else None)
              or (failures[0] if failures else page))
    raise chosen
