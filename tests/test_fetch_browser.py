"""Browser lane against the local publisher, with the real Debian Chromium.

These tests fail (never skip) when Chromium or Playwright is missing: a
worker image without a working browser must not pass CI.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.publisher import BROWSER_KINDS
from tests.publisher.memory import fetch_peak, serve_in_child, stop_child
from workers.fetch import FetchConfig, browser_available, browser_status, close_browser, fetch_document
from workers.fetch import browser as browser_lane
from workers.fetch.chromium import thread_browser

pytestmark = pytest.mark.processes  # Chromium, and the publisher in a child


@pytest.fixture(scope="module")
def cfg(pub):
    config = pub.fetch_config(timeout_s=15)
    ok, reason = browser_status(config, max_age_s=0)
    if not ok:
        pytest.fail(f"Chromium is required for these tests: {reason}", pytrace=False)
    yield config
    close_browser()


def lanes(result) -> list[tuple[str, str]]:
    return [(lane["lane"], lane["error_code"]) for lane in result.details["lanes"]]


def test_browser_available(cfg):
    assert browser_available(cfg)
    missing = FetchConfig(chromium_path="/nonexistent/chromium")
    ok, reason = browser_status(missing)
    assert not ok and "no Chromium executable" in reason
    assert not browser_available(missing)


@pytest.mark.parametrize("kind, captured", [
    ("jslink", "network"),        # a PDF link that appears only after JS runs
    ("jsredirect", "network"),    # JS goes to an inline PDF: caught before Chrome's viewer
    ("jsattach", "network"),      # JS goes to a Content-Disposition: attachment PDF
    ("blob", "download"),         # the page builds the PDF and saves it: a download event
    ("jschallenge", "network"),   # a bot check that sets a cookie from JS and reloads
])
def test_browser_ways_to_a_pdf(pub, cfg, tmp_path, kind, captured):
    paper = pub.papers(1, (kind,), start=300 + BROWSER_KINDS.index(kind))[0]
    result = fetch_document(paper.value, str(tmp_path), cfg)
    assert result.ok, result
    assert result.strategy == "browser" and result.details["captured"] == captured
    assert result.sha256 == paper.sha256 and Path(result.path).name == f"{paper.sha256}.pdf"
    assert lanes(result)[0][0] == "http"           # the HTTP lanes were tried first and failed
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{paper.sha256}.pdf"]


def test_redirects_inside_the_browser_are_followed_and_counted(pub, cfg, tmp_path):
    result = fetch_document(f"{pub.url}/js/chain/4/40", str(tmp_path), cfg)
    assert result.ok and result.strategy == "browser" and result.sha256 == pub.sha256(40), result
    too_many = fetch_document(f"{pub.url}/js/chain/12/40", str(tmp_path / "x"), cfg)
    assert too_many.error_code == "network" and too_many.details["reason"] == "too_many_redirects"


def test_browser_keeps_cookies_between_pages(pub, cfg, tmp_path):
    """The landing page sets a session cookie; the PDF (opened via JS) needs it."""
    result = fetch_document(f"{pub.url}/js/cookie/41", str(tmp_path), cfg)
    assert result.ok and result.sha256 == pub.sha256(41), result


@pytest.mark.parametrize("path, code, details", [
    ("/paywall/1", "paywall", {"http_status": 200}),
    ("/paywall403/1", "paywall", {"http_status": 403}),
    ("/nolink/1", "not_found", {"reason": "no_pdf_link"}),
    ("/js/missing/1", "not_found", {"http_status": 404}),
    ("/js/fakepdf/1", "invalid_pdf", {"reason": "not_pdf"}),
    ("/js/truncated/1", "invalid_pdf", {"reason": "unparseable"}),
])
def test_browser_classified_failures(pub, cfg, tmp_path, path, code, details):
    result = fetch_document(pub.url + path, str(tmp_path), cfg)
    assert not result.ok and result.error_code == code, result
    assert result.strategy == "browser" and [lane for lane, _ in lanes(result)] == ["http", "browser"]
    for key, value in details.items():
        assert result.details.get(key) == value, (key, result.details)
    assert list(tmp_path.iterdir()) == []


def test_browser_challenge_that_never_clears(pub, cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(browser_lane, "CHALLENGE_WAIT_S", 1.0)
    for path in ("/challenge/1", "/captcha/1"):
        result = fetch_document(pub.url + path, str(tmp_path), cfg)
        assert result.error_code == "challenge" and result.strategy == "browser", result


def test_browser_lane_oversized_pdf(pub, tmp_path):
    cfg = pub.fetch_config(timeout_s=15, max_bytes=1 << 20)
    result = fetch_document(f"{pub.url}/js/huge/1?bytes=5000000", str(tmp_path), cfg)
    assert result.error_code == "invalid_pdf" and result.details["reason"] == "too_large", result
    assert list(tmp_path.iterdir()) == []


def test_browser_lane_timeout(pub, tmp_path):
    cfg = pub.fetch_config(timeout_s=2)
    result = fetch_document(f"{pub.url}/js/slow/1?delay=6", str(tmp_path), cfg)
    assert result.error_code == "timeout" and result.strategy == "browser", result
    assert result.details["lanes"][-1]["elapsed_ms"] < 4000


def test_browser_is_reused_per_thread_and_threads_have_their_own(pub, cfg, tmp_path):
    first = thread_browser(cfg)
    assert fetch_document(f"{pub.url}/jsredirect/50", str(tmp_path), cfg).ok
    assert thread_browser(cfg) is first
    results, browsers = {}, {}

    def work(n):
        try:
            browsers[n] = thread_browser(cfg)
            results[n] = fetch_document(f"{pub.url}/jslink/{n}", str(tmp_path), cfg)
        finally:
            close_browser()
    threads = [threading.Thread(target=work, args=(n,)) for n in (51, 52)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results[51].sha256 == pub.sha256(51) and results[52].sha256 == pub.sha256(52)
    assert browsers[51] is not browsers[52] and first not in browsers.values()


def test_browser_is_relaunched_after_it_died(pub, cfg, tmp_path):
    thread_browser(cfg).close()            # as if Chromium had crashed between documents
    result = fetch_document(f"{pub.url}/jsredirect/53", str(tmp_path), cfg)
    assert result.ok and result.sha256 == pub.sha256(53), result


def test_browser_lane_streams_large_pdf_to_disk(tmp_path):
    """A 24 MiB inline PDF caught in the browser lane never sits in the worker's memory."""
    server, info = serve_in_child("--paper-bytes", str(24 << 20), "--papers", "1", "--kinds", "browser")
    try:
        paper = info["papers"][0]
        assert paper["kind"] == "jslink"
        result = fetch_peak(paper["value"], str(tmp_path), lane="browser",
                            allow_addresses=info["allow_addresses"], timeout_s=30)
    finally:
        stop_child(server)
    assert result["sha256"] == paper["sha256"] and result["size"] > 24_000_000
    assert result["strategy"] == "browser"
    assert result["peak"] < 4 << 20, f"peak Python allocation {result['peak']} bytes for a 24 MiB PDF"
