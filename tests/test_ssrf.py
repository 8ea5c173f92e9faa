"""SSRF rules of the fetch ladder (DESIGN §9, §11): refused targets, pinning, allow-list.

Every refusal through the publisher goes to a target that would really
answer (the publisher's decoy server on 127.0.0.1) or that would hang
(10.x), and the tests check the decoy saw nothing: the refusal happened
before any connection.
"""
from __future__ import annotations

import ipaddress
import socket
import time

import pytest

from tests.publisher import Publisher
from workers.fetch import addresses, browser, fetch_document
from workers.fetch.safe_http import SafeClient
from workers.fetch.types import Blocked, FetchConfig

REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture
def cfg(pub):
    return pub.fetch_config(timeout_s=10, use_browser=False)


def fake_dns(monkeypatch, answers: dict[str, list[str]], calls: list | None = None):
    """Make ``addresses.getaddrinfo`` answer ``answers`` for the named hosts."""
    def getaddrinfo(host, port, *args, **kwargs):
        if calls is not None:
            calls.append(host)
        if host in answers:
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                     (a, port) if ":" not in a else (a, port, 0, 0)) for a in answers[host]]
        return REAL_GETADDRINFO(host, port, *args, **kwargs)
    monkeypatch.setattr(addresses, "getaddrinfo", getaddrinfo)


# --- the address rules --------------------------------------------------------

@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.0.0.1", "private"), ("172.16.5.4", "private"), ("192.168.1.1", "private"),
    ("fc00::1", "private"), ("fd12:3456::1", "private"),
    ("169.254.169.254", "link_local"), ("169.254.1.1", "link_local"), ("fe80::1", "link_local"),
    ("fe80::1%eth0", "link_local"),
    ("100.64.0.1", "cgnat"), ("100.127.255.254", "cgnat"),
    ("224.0.0.1", "multicast"), ("239.1.2.3", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"),
    ("192.0.2.10", "private"), ("198.18.0.1", "private"),       # documentation, benchmarking
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.1.2.3", "private"),
    ("::ffff:169.254.169.254", "link_local"),
])
def test_non_public_addresses_are_refused(address, reason):
    assert addresses.refusal(address) == reason


@pytest.mark.parametrize("address", [
    "2002:7f00:1::1",                             # 6to4 of 127.0.0.1
    "2002:a00:1::1",                              # 6to4 of 10.0.0.1
    "2001:0:4136:e378:8000:63bf:80ff:fffe",       # Teredo whose client is 127.0.0.1
    "64:ff9b::a9fe:a9fe",                         # NAT64 of 169.254.169.254
    "::127.0.0.1",                                # IPv4-compatible
])
def test_ipv6_forms_embedding_forbidden_ipv4_are_refused(address):
    assert addresses.refusal(address) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111",
                                     "::ffff:8.8.8.8"])
def test_public_addresses_pass(address):
    assert addresses.refusal(address) is None


def test_allow_list_admits_only_what_it_lists():
    allow = FetchConfig(allow_addresses=["127.0.0.2/32", ipaddress.ip_network("10.9.0.0/16")]).allowed_networks()
    assert addresses.refusal("127.0.0.2", allow) is None
    assert addresses.refusal("::ffff:127.0.0.2", allow) is None      # the same host, mapped
    assert addresses.refusal("10.9.1.1", allow) is None
    for other in ("127.0.0.1", "127.0.0.3", "10.8.0.1", "169.254.169.254", "::1"):
        assert addresses.refusal(other, allow) is not None, other
    assert FetchConfig().allowed_networks() == ()


def test_dns_answer_mixing_public_and_private_is_refused(monkeypatch):
    fake_dns(monkeypatch, {"mixed.test": ["93.184.216.34", "10.0.0.7"],
                           "private.test": ["192.168.0.10"], "public.test": ["93.184.216.34"]})
    with pytest.raises(Blocked) as info:
        addresses.resolve("mixed.test", 80)
    assert info.value.details["reason"] == "mixed_dns_answer"
    with pytest.raises(Blocked) as info:
        addresses.resolve("private.test", 80)
    assert info.value.details["reason"] == "private"
    assert addresses.resolve("public.test", 80) == ["93.184.216.34"]


# --- refusals through the ladder ------------------------------------------------

@pytest.mark.parametrize("target", ["loopback", "localhost", "mapped", "private", "linklocal",
                                    "metadata", "cgnat"])
def test_redirect_into_forbidden_address_is_refused(pub, cfg, tmp_path, target):
    before = len(pub.decoy_hits())
    started = time.monotonic()
    result = fetch_document(f"{pub.url}/ssrf/{target}", str(tmp_path), cfg)
    assert not result.ok
    assert result.error_code == "network" and result.details["blocked"] is True, result
    assert time.monotonic() - started < 3          # refused, not a connect attempt timing out
    assert len(pub.decoy_hits()) == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make_url", [
    lambda pub: f"{pub.decoy_url}/papers/1.pdf",
    lambda pub: f"http://[::ffff:127.0.0.1]:{pub.decoy_port}/papers/1.pdf",
    lambda pub: f"http://2130706433:{pub.decoy_port}/papers/1.pdf",     # 127.0.0.1 as one number
    lambda pub: f"http://0x7f.1:{pub.decoy_port}/papers/1.pdf",         # and in inet_aton hex
    lambda pub: f"http://localhost:{pub.decoy_port}/papers/1.pdf",
    lambda pub: "http://169.254.169.254/latest/meta-data/",
    lambda pub: "http://[fd00::1]/x.pdf",
])
def test_forbidden_urls_are_refused_directly(pub, cfg, tmp_path, make_url):
    before = len(pub.decoy_hits())
    result = fetch_document(make_url(pub), str(tmp_path), cfg)
    assert result.error_code == "network" and result.details.get("blocked"), result
    assert len(pub.decoy_hits()) == before


def test_landing_page_link_into_private_network_is_refused(pub, cfg, tmp_path):
    for what in ("landing-private", "landing-metadata", "landing-loopback"):
        result = fetch_document(f"{pub.url}/ssrf/{what}", str(tmp_path), cfg)
        assert result.error_code == "network" and result.details["blocked"], result
        assert result.strategy == "landing"
    assert pub.decoy_hits() == []


def test_dns_answer_mixing_addresses_is_refused_end_to_end(pub, cfg, tmp_path, monkeypatch):
    fake_dns(monkeypatch, {"mixed.test": [pub.host, "10.0.0.7"]})
    result = fetch_document(f"http://mixed.test:{pub.port}/papers/1.pdf", str(tmp_path), cfg)
    assert result.error_code == "network" and result.details["reason"] == "mixed_dns_answer"
    assert not [r for r in pub.requests if r["host"].startswith("mixed.test")]


def test_connection_is_pinned_to_the_vetted_address(pub, cfg, tmp_path, monkeypatch):
    """DNS answers public once, then loopback (rebinding): only the vetted IP is used."""
    calls: list[str] = []
    answers = iter([[pub.host]])

    def rebinding(host, port, *args, **kwargs):
        calls.append(host)
        if host == "papers.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                    for a in next(answers, ["127.0.0.1"])]
        return REAL_GETADDRINFO(host, port, *args, **kwargs)
    monkeypatch.setattr(addresses, "getaddrinfo", rebinding)
    result = fetch_document(f"http://papers.test:{pub.port}/papers/7.pdf", str(tmp_path), cfg)
    assert result.ok, result
    assert result.sha256 == pub.sha256(7)
    assert calls == ["papers.test"]                     # resolved exactly once
    seen = [r for r in pub.requests if r["path"] == "/papers/7.pdf"]
    assert seen[-1]["host"] == f"papers.test:{pub.port}" and seen[-1]["server"] == "main"


def test_tls_uses_the_host_name_for_sni_and_certificate(tmp_path, monkeypatch):
    with Publisher(tls_hostname="papers.test") as tls_pub:
        fake_dns(monkeypatch, {"papers.test": [tls_pub.host]})
        cfg = tls_pub.fetch_config(timeout_s=10, use_browser=False)
        result = fetch_document(f"{tls_pub.url}/landing/3", str(tmp_path), cfg)
        assert result.ok and result.strategy == "landing", result
        assert result.sha256 == tls_pub.sha256(3)
        assert set(tls_pub.sni) == {"papers.test"}
        assert {r["host"] for r in tls_pub.requests} == {f"papers.test:{tls_pub.port}"}
        # The certificate names papers.test only: by IP the check must fail.
        by_ip = fetch_document(f"https://{tls_pub.host}:{tls_pub.port}/papers/3.pdf", str(tmp_path), cfg)
        assert by_ip.error_code == "network" and by_ip.details["reason"] == "tls", by_ip
        # And an unknown CA is refused too.
        untrusted = fetch_document(f"{tls_pub.url}/papers/3.pdf", str(tmp_path),
                                   tls_pub.fetch_config(ca_bundle=None, use_browser=False))
        assert untrusted.error_code == "network" and untrusted.details["reason"] == "tls"


def test_redirects_are_limited(pub, cfg, tmp_path):
    assert fetch_document(f"{pub.url}/chain/10/2", str(tmp_path), cfg).ok
    result = fetch_document(f"{pub.url}/chain/11/2", str(tmp_path), cfg)
    assert result.error_code == "network" and result.details["reason"] == "too_many_redirects"


def test_proxy_environment_is_ignored(pub, cfg, tmp_path, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, pub.decoy_url)
    before = len(pub.decoy_hits())
    assert fetch_document(f"{pub.url}/papers/4.pdf", str(tmp_path), cfg).ok
    assert len(pub.decoy_hits()) == before


def test_cross_origin_redirect_drops_caller_credentials(pub, cfg, monkeypatch):
    fake_dns(monkeypatch, {"other.test": [pub.host]})
    target = f"http://other.test:{pub.port}/papers/1.pdf"
    with SafeClient(cfg, cookies=False) as client:
        response = client.request(f"{pub.url}/to?url={target}", deadline=time.monotonic() + 5,
                                  headers={"Cookie": "secret=1", "Authorization": "Bearer x"})
        response.close()
    assert response.status == 200 and response.url == target
    first, second = pub.requests[-2:]
    assert first["path"].startswith("/to?") and first["cookie"] == "secret=1" and first["authorization"]
    assert second["host"] == f"other.test:{pub.port}"
    assert second["cookie"] is None and second["authorization"] is None


# --- the browser lane ------------------------------------------------------------

@pytest.mark.parametrize("target", ["loopback", "metadata", "private", "mapped"])
def test_browser_lane_refuses_forbidden_navigation(pub, tmp_path, target):
    """A page whose JS navigates (or a redirect the browser gets) into forbidden space."""
    cfg = pub.fetch_config(timeout_s=30)
    for path in (f"/ssrf/js-{target}", f"/js/ssrf/{target}"):
        with pytest.raises(Blocked):
            browser.fetch_with_browser(pub.url + path, str(tmp_path), cfg)
    assert pub.decoy_hits() == []
    assert list(tmp_path.iterdir()) == []


def test_browser_lane_refuses_forbidden_subresources(pub, tmp_path):
    """Scripts, iframes and fetch() into forbidden space are refused; the PDF still comes."""
    cfg = pub.fetch_config(timeout_s=30)
    for target in ("loopback", "metadata"):
        path, info, source, strategy, details = browser.fetch_with_browser(
            f"{pub.url}/ssrf/embed-{target}", str(tmp_path), cfg)
        assert info.sha256 == pub.sha256(9) and strategy == "browser"
        assert pub.ssrf_targets()[target] in details["blocked_requests"]
    assert pub.decoy_hits() == []


def test_chromium_cannot_reach_the_network_by_itself(pub):
    """The backstop: without our routing, Chromium resolves nothing (IP literals included)."""
    chromium = browser.thread_browser(pub.fetch_config())
    context = chromium.new_context()
    try:
        page = context.new_page()
        for url in (f"{pub.url}/papers/1.pdf", f"{pub.decoy_url}/papers/1.pdf"):
            with pytest.raises(Exception, match="ERR_NAME_NOT_RESOLVED"):
                page.goto(url, timeout=5000)
    finally:
        context.close()
        browser.close_browser()
    assert pub.decoy_hits() == []
