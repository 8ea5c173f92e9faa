"""Name the reason a page gave no PDF: paywall, challenge, not_found, ...

Only consulted after the lanes found no PDF, so a landing page that merely
has a "Sign in" button in its header but also a PDF link never gets here.
Challenge markers win over paywall markers: bot walls often also say "log in".
"""
from __future__ import annotations

from .types import CHALLENGE, FetchFailure, NETWORK, NOT_FOUND, PAYWALL, THROTTLED

SCAN_CHARS = 256 * 1024

CHALLENGE_MARKERS = (
    "captcha", "hcaptcha", "turnstile", "cf-challenge", "cf_chl", "cf-chl", "challenge-platform",
    "verify you are human", "verifying you are human", "are you a robot", "not a robot",
    "checking your browser", "checking if the site connection is secure", "just a moment",
    "unusual traffic", "ddos protection", "bot detection", "attention required",
    "please enable javascript and cookies", "px-captcha", "datadome",
)
PAYWALL_MARKERS = (
    "subscribe", "subscription", "purchase", "buy this article", "buy article", "rent this article",
    "get access", "log in to", "login to", "sign in to", "institutional access",
    "access through your institution", "paywall", "pay per view", "pay-per-view",
)


def page_markers(text: str) -> tuple[bool, bool]:
    """(challenge, paywall) markers present in the first part of ``text``."""
    lower = text[:SCAN_CHARS].lower()
    return (any(m in lower for m in CHALLENGE_MARKERS), any(m in lower for m in PAYWALL_MARKERS))


def classify_page(status: int, text: str, url: str, retry_after_s: float | None = None) -> FetchFailure:
    """The failure for a page (any status) that did not lead to a PDF.

    ``retry_after_s``: the page's ``Retry-After``, if it sent one; a site that
    pushes back (challenge, throttled) names it so the master pauses the site
    for the whole fleet at least that long (workers.wire.failures)."""
    challenge, paywall = page_markers(text)
    details = {"http_status": status, "url": url}
    if retry_after_s is not None:
        details["retry_after_s"] = retry_after_s
    if status in (404, 410):
        return FetchFailure(NOT_FOUND, f"{url} answered {status}", **details)
    if challenge and (status < 400 or status in (403, 429, 503)):
        return FetchFailure(CHALLENGE, f"{url} shows a bot check (HTTP {status})", **details)
    if status in (401, 402, 403) or (status < 400 and paywall):
        return FetchFailure(PAYWALL, f"{url} requires access (HTTP {status})", **details)
    if status in (429, 503):
        waited = f", Retry-After {retry_after_s:g} s" if retry_after_s is not None else ""
        return FetchFailure(THROTTLED, f"{url} is rate limiting us (HTTP {status}{waited})", **details)
    if status >= 400:
        return FetchFailure(NETWORK, f"{url} answered {status}", reason="http_error", **details)
    return FetchFailure(NOT_FOUND, f"no PDF found on {url}", reason="no_pdf_link", **details)
