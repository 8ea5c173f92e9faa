"""HTTP lanes of the fetch ladder against the local publisher: every way to a PDF
and every failure class, without the browser (``use_browser=False``) unless a
test is about the hand-over to it."""
from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from tests.publisher import HTTP_KINDS
from tests.publisher.memory import fetch_peak, serve_in_child, stop_child
from workers.fetch import FetchConfig, FetchResult, fetch_document, target_url
from workers.fetch.landing import pdf_links


@pytest.fixture
def cfg(pub):
    return pub.fetch_config(timeout_s=10, use_browser=False)


def fetch(pub, cfg, path_or_value: str, tmp_path) -> FetchResult:
    value = pub.url + path_or_value if path_or_value.startswith("/") else path_or_value
    return fetch_document(value, str(tmp_path), cfg)


def assert_fetched(result: FetchResult, sha256: str, strategy: str, tmp_path) -> None:
    assert result.ok, result
    assert result.strategy == strategy
    assert result.error_code is None
    assert result.sha256 == sha256
    path = Path(result.path)
    assert path.parent == Path(tmp_path) and path.name == f"{sha256}.pdf"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256 and path.stat().st_size == result.size
    assert result.details["pages"] == 2
    assert not [p for p in Path(tmp_path).iterdir() if p.suffix == ".part"]


def assert_failed(result: FetchResult, code: str, tmp_path, **details) -> None:
    assert not result.ok and result.error_code == code, result
    assert result.path is None and result.sha256 is None
    for key, value in details.items():
        assert result.details.get(key) == value, (key, result.details)
    assert list(Path(tmp_path).iterdir()) == []          # nothing left behind


# --- ways to a PDF -------------------------------------------------------------

@pytest.mark.parametrize("path, strategy", [
    ("/papers/{n}.pdf", "direct"),              # Content-Type application/pdf
    ("/attachment/{n}", "direct"),              # attachment, application/octet-stream: sniffed
    ("/chain/4/{n}", "direct"),                 # 301/302/303/307/308 chain
    ("/landing/{n}", "landing"),                # citation_pdf_url meta tag
    ("/links/{n}", "landing"),                  # <a>Download PDF</a> without .pdf in the URL
    ("/cookie/{n}", "landing"),                 # the PDF needs the cookie the landing page set
    ("/arxiv/abs/2101.0000{n}", "landing"),
])
def test_http_ways_to_a_pdf(pub, cfg, tmp_path, path, strategy):
    n = 20 + len(path)
    result = fetch(pub, cfg, path.format(n=n), tmp_path)
    sha = pub.arxiv_sha256(f"2101.0000{n}") if "arxiv" in path else pub.sha256(n)
    assert_fetched(result, sha, strategy, tmp_path)
    assert result.source_url.startswith(pub.url)


def test_every_http_kind_of_papers_list(pub, cfg, tmp_path):
    papers = pub.papers(len(HTTP_KINDS) * 2, start=100)
    assert {p.kind for p in papers} == set(HTTP_KINDS) and {p.lane for p in papers} == {"http"}
    for paper in papers:
        assert fetch_document(paper.value, str(tmp_path), cfg).sha256 == paper.sha256, paper


def test_doi_goes_through_the_configured_resolver(pub, cfg, tmp_path):
    for value in ("10.5555/landing/31", "doi:10.5555/papers/31.pdf", "https://doi.org/10.5555/links/31"):
        result = fetch_document(value, str(tmp_path), cfg)
        assert result.ok and result.sha256 == pub.sha256(31), (value, result)
    assert any(r["path"] == "/doi/10.5555/landing/31" for r in pub.requests)


def test_arxiv_ids_map_to_the_pdf_route(pub, cfg, tmp_path):
    for value in ("2101.00042", "arXiv:2101.00042v2", "https://arxiv.org/abs/2101.00042"):
        result = fetch_document(value, str(tmp_path), cfg)
        assert_fetched(result, pub.arxiv_sha256("2101.00042"), "direct", tmp_path)
    assert any(r["path"] == "/arxiv/pdf/2101.00042v2" for r in pub.requests)
    old = fetch_document("hep-th/9901001", str(tmp_path), cfg)
    assert old.ok and old.source_url.endswith("/arxiv/pdf/hep-th/9901001")


def test_target_urls():
    cfg = FetchConfig(doi_resolver="https://doi.org/", arxiv_base="https://arxiv.org")
    assert target_url("10.1000/ABC#1?x", cfg) == "https://doi.org/10.1000/abc%231%3Fx"
    assert target_url("arXiv:2101.00001v3", cfg) == "https://arxiv.org/pdf/2101.00001v3"
    assert target_url("HTTPS://Example.org/a.pdf#frag", cfg) == "https://example.org/a.pdf"


def test_same_paper_twice_is_one_file(pub, cfg, tmp_path):
    first = fetch(pub, cfg, "/papers/5.pdf", tmp_path)
    second = fetch(pub, cfg, "/landing/5", tmp_path)
    assert first.path == second.path and len(list(tmp_path.iterdir())) == 1


def test_user_agent_is_sent(pub, tmp_path):
    cfg = pub.fetch_config(use_browser=False, user_agent="FleetHQ-worker/test-ua")
    assert fetch(pub, cfg, "/papers/6.pdf?ua", tmp_path).ok
    assert [r["user_agent"] for r in pub.requests if r["path"] == "/papers/6.pdf?ua"] == ["FleetHQ-worker/test-ua"]


def test_landing_parser_ranks_links():
    html = """<html><head><base href="/base/">
      <meta name="citation_pdf_url" content="https://pub.example/meta.pdf">
      <link rel="alternate" type="application/pdf" href="alt.pdf"></head><body>
      <a href="supp/data.zip">Data</a><a href="/full.pdf#page=2">Full text</a>
      <a href="/get?id=1" title="Download PDF"><span>Get it</span></a>
      <a href="mailto:x@y.z">PDF by mail</a><a href="javascript:void(0)">PDF</a>
      <iframe src="/viewer/frame"></iframe></body></html>"""
    assert pdf_links(html, "https://pub.example/article/1") == [
        "https://pub.example/meta.pdf", "https://pub.example/base/alt.pdf",
        "https://pub.example/full.pdf", "https://pub.example/get?id=1", "https://pub.example/viewer/frame"]
    assert pdf_links("<p>no links", "https://x.example/") == []
    assert pdf_links("<a href='%s.pdf'>" % ("x" * 10), "https://x.example/")[0].endswith("xxxx.pdf")


# --- failure classes -----------------------------------------------------------

@pytest.mark.parametrize("path, code, status", [
    ("/paywall/1", "paywall", 200),             # 200 page with subscribe/purchase text
    ("/paywall403/1", "paywall", 403),
    ("/locked/1", "paywall", 401),              # landing fine, its PDF link wants a login
    ("/challenge/1", "challenge", 503),         # "Just a moment... verify you are human"
    ("/captcha/1", "challenge", 403),
    ("/missing/1", "not_found", 404),
    ("/gone/1", "not_found", 410),
    ("/nolink/1", "not_found", 200),            # a page without any PDF link
])
def test_classified_page_failures(pub, cfg, tmp_path, path, code, status):
    result = fetch(pub, cfg, path, tmp_path)
    assert_failed(result, code, tmp_path, http_status=status, browser="disabled"
                  if status not in (404, 410) else None)


def test_html_served_as_pdf_is_invalid(pub, cfg, tmp_path):
    assert_failed(fetch(pub, cfg, "/fakepdf/1", tmp_path), "invalid_pdf", tmp_path, reason="not_pdf")


def test_truncated_pdf_is_refused_by_the_master_check(pub, cfg, tmp_path):
    result = fetch(pub, cfg, "/truncated/2", tmp_path)
    assert_failed(result, "invalid_pdf", tmp_path, reason="unparseable")
    assert ".part" not in result.message


@pytest.mark.parametrize("declared", [False, True])
def test_oversized_response_is_cut_off(pub, tmp_path, declared):
    cfg = pub.fetch_config(use_browser=False, max_bytes=1 << 20)
    path = "/huge/1?bytes=5000000" + ("&declared=1" if declared else "")
    started = time.monotonic()
    assert_failed(fetch(pub, cfg, path, tmp_path), "invalid_pdf", tmp_path, reason="too_large")
    assert time.monotonic() - started < 2


def test_slow_response_times_out(pub, tmp_path):
    cfg = pub.fetch_config(use_browser=False, timeout_s=1)
    started = time.monotonic()
    assert_failed(fetch(pub, cfg, "/slow/1?delay=4", tmp_path), "timeout", tmp_path)
    assert time.monotonic() - started < 2


def test_dripping_body_hits_the_total_time_cap(pub, tmp_path):
    """Every read is quick, the whole body is not: the lane budget still applies."""
    cfg = pub.fetch_config(use_browser=False, timeout_s=1.5)
    started = time.monotonic()
    assert_failed(fetch(pub, cfg, "/drip/1?interval=0.2", tmp_path), "timeout", tmp_path)
    assert time.monotonic() - started < 2.5


def test_connection_refused_is_network(pub, cfg, tmp_path):
    import socket
    with socket.socket() as s:          # a port on the allowed address that nobody listens on
        s.bind((pub.host, 0))
        port = s.getsockname()[1]
    result = fetch_document(f"http://{pub.host}:{port}/x.pdf", str(tmp_path), cfg)
    assert_failed(result, "network", tmp_path, reason="connection")


def test_unresolvable_host_is_network(cfg, tmp_path):
    result = fetch_document("http://no-such-host.invalid/paper.pdf", str(tmp_path), cfg)
    assert_failed(result, "network", tmp_path, reason="dns")


@pytest.mark.parametrize("value", ["", "ftp://example.org/a.pdf", "not a paper", "http://user:pw@example.org/"])
def test_invalid_values_are_classified(cfg, tmp_path, value):
    assert_failed(fetch_document(value, str(tmp_path), cfg), "invalid_identifier", tmp_path)


# --- hand-over to the browser lane -----------------------------------------------

def test_without_chromium_http_lanes_still_work(pub, tmp_path):
    cfg = pub.fetch_config(chromium_path="/nonexistent/chromium", timeout_s=10)
    assert_fetched(fetch(pub, cfg, "/landing/8", tmp_path / "a"), pub.sha256(8), "landing", tmp_path / "a")
    result = fetch(pub, cfg, "/jslink/8", tmp_path / "b")
    assert_failed(result, "not_found", tmp_path / "b", reason="no_pdf_link", retry_with_browser=True)
    assert result.details["browser"].startswith("unavailable")
    assert [lane["lane"] for lane in result.details["lanes"]] == ["http", "browser"]


def test_hard_failures_do_not_start_the_browser(pub, tmp_path):
    cfg = pub.fetch_config(chromium_path="/nonexistent/chromium", timeout_s=1)
    for path, code in (("/missing/1", "not_found"), ("/fakepdf/1", "invalid_pdf"),
                       ("/slow/1?delay=3", "timeout"), ("/ssrf/private", "network")):
        result = fetch(pub, cfg, path, tmp_path)
        assert result.error_code == code and [lane["lane"] for lane in result.details["lanes"]] == ["http"]


# --- resources --------------------------------------------------------------------

def test_large_pdf_is_streamed_not_held_in_memory(tmp_path):
    server, info = serve_in_child("--paper-bytes", str(24 << 20), "--papers", "1")
    try:
        paper = info["papers"][0]
        result = fetch_peak(paper["value"], str(tmp_path), allow_addresses=info["allow_addresses"],
                            use_browser=False)
    finally:
        stop_child(server)
    assert result["ok"] and result["sha256"] == paper["sha256"] and result["size"] > 24_000_000
    assert result["peak"] < 2 << 20, f"peak Python allocation {result['peak']} bytes for a 24 MiB PDF"


def test_concurrent_fetches(pub, cfg, tmp_path):
    papers = pub.papers(12, start=200)
    results: dict = {}

    def run(chunk):
        for paper in chunk:
            results[paper.number] = fetch_document(paper.value, str(tmp_path), cfg)
    threads = [threading.Thread(target=run, args=(papers[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[p.number].sha256 == p.sha256 for p in papers)


@pytest.mark.parametrize("path, status, retry_after", [
    ("/throttled/1?after=90", 429, 90.0),       # Too Many Requests with Retry-After
    ("/throttled/1?after=", 429, None),         # without one
    ("/busy/1", 503, None),                     # Service Unavailable, no bot check
])
def test_a_site_that_rate_limits_us_is_throttled_and_names_its_wait(pub, cfg, tmp_path, path, status,
                                                                     retry_after):
    """The site pushing back (workers.wire.failures): the master pauses it for
    the whole fleet at least Retry-After; the browser lane is not tried (it
    would only press the site harder)."""
    result = fetch(pub, cfg, path, tmp_path)
    assert_failed(result, "throttled", tmp_path, http_status=status, retry_after_s=retry_after)
    assert "browser" not in result.details
