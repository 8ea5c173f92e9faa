"""Launching Debian's Chromium through Playwright, one browser per thread.

Playwright's sync API is bound to the thread that started it, so each worker
thread keeps its own ``sync_playwright()`` and browser in a thread-local and
reuses it across documents (launch costs ~0.3 s, a fresh context per document
keeps cookies apart). ``close_browser()`` ends the calling thread's browser.

Chromium never opens a connection of its own: the browser lane answers every
request from Python (see browser.py), and ``--host-resolver-rules=MAP *
~NOTFOUND`` makes any request that slips past the routing (a redirect Chrome
follows by itself, a WebSocket, a preconnect) fail name resolution — IP
literals included. That is the backstop DESIGN §11 asks for; network
isolation of the container stays the first line.
"""
from __future__ import annotations

import os
import threading
import time

from .types import FetchFailure, NETWORK

REQUIRED_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
BACKSTOP_FLAGS = ["--host-resolver-rules=MAP * ~NOTFOUND",
                  "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
                  "--webrtc-ip-handling-policy=disable_non_proxied_udp",
                  # Docker's default /dev/shm (64 MiB) is too small for Chromium.
                  "--disable-dev-shm-usage"]
CHROMIUM_FLAGS = REQUIRED_FLAGS + BACKSTOP_FLAGS
LAUNCH_TIMEOUT_MS = 30_000
PROBE_MAX_AGE_S = 60

_local = threading.local()
_probe_lock = threading.Lock()
_probe_cache: dict[str, tuple[float, bool, str]] = {}


class BrowserUnavailable(FetchFailure):
    """Chromium or Playwright is missing or will not start."""

    def __init__(self, message: str):
        super().__init__(NETWORK, message, browser="unavailable")


def _launch(chromium_path: str):
    if not os.access(chromium_path, os.X_OK):
        raise BrowserUnavailable(f"no Chromium executable at {chromium_path}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BrowserUnavailable("playwright is not installed") from None
    playwright = None
    try:
        playwright = sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_FLAGS,
                                             headless=True, timeout=LAUNCH_TIMEOUT_MS)
    except Exception as exc:
        if playwright is not None:
            try:
                playwright.stop()
            except Exception:
                pass
        raise BrowserUnavailable(f"Chromium did not start: {str(exc).splitlines()[0][:300]}") from None
    return playwright, browser


def thread_browser(cfg):
    """This thread's running browser, launched on first use or after a crash."""
    browser = getattr(_local, "browser", None)
    if browser is not None and _local.path == cfg.chromium_path and browser.is_connected():
        return browser
    close_browser()
    _local.playwright, _local.browser = _launch(cfg.chromium_path)
    _local.path = cfg.chromium_path
    return _local.browser


def close_browser() -> None:
    """Close the calling thread's browser and Playwright driver, if any."""
    browser, playwright = getattr(_local, "browser", None), getattr(_local, "playwright", None)
    _local.browser = _local.playwright = None
    for action in (browser and browser.close, playwright and playwright.stop):
        if action:
            try:
                action()
            except Exception:   # already dead: nothing left to release
                pass


def _probe(chromium_path: str) -> tuple[bool, str]:
    try:
        playwright, browser = _launch(chromium_path)
    except BrowserUnavailable as exc:
        return False, exc.message
    try:
        page = browser.new_page()
        page.set_content("<p>ok</p>")
        ok = page.inner_text("p") == "ok"
        return ok, "" if ok else "page did not render"
    except Exception as exc:
        return False, f"Chromium started but cannot render: {str(exc)[:300]}"
    finally:
        try:
            browser.close()
            playwright.stop()
        except Exception:
            pass


def browser_available(cfg, max_age_s: float = PROBE_MAX_AGE_S) -> bool:
    """Can Chromium be launched and render a page? Cached for ``max_age_s``.

    The probe runs in a thread of its own: the caller may be a thread whose
    own Playwright is busy, and a second ``sync_playwright()`` there fails.
    """
    return browser_status(cfg, max_age_s)[0]


def browser_status(cfg, max_age_s: float = PROBE_MAX_AGE_S) -> tuple[bool, str]:
    """(available, reason when not) — the reason is for heartbeats and logs."""
    with _probe_lock:
        cached = _probe_cache.get(cfg.chromium_path)
        if cached and time.monotonic() - cached[0] < max_age_s:
            return cached[1], cached[2]
        out: list = []
        thread = threading.Thread(target=lambda: out.append(_probe(cfg.chromium_path)),
                                  name="chromium-probe", daemon=True)
        thread.start()
        thread.join(LAUNCH_TIMEOUT_MS / 1000 + 15)
        ok, reason = out[0] if out else (False, "Chromium probe hung")
        _probe_cache[cfg.chromium_path] = (time.monotonic(), ok, reason)
        return ok, reason
