"""Canonical asset keys: the table a user's job values will hit.

Pure functions: no database, no app (so none of conftest's fixtures).
"""
import subprocess
import sys

import pytest

from workers.wire.canonical import Identifier, InvalidIdentifier, canonical_key, classify

ACCEPTED = [
    # DOIs, every accepted spelling of one DOI, then the edges of the prefix rule
    ("10.1234/abc", "doi:10.1234/abc"),
    ("10.1234/ABC", "doi:10.1234/abc"),
    ("doi:10.1234/abc", "doi:10.1234/abc"),
    ("DOI: 10.1234/AbC", "doi:10.1234/abc"),
    ("https://doi.org/10.1234/abc", "doi:10.1234/abc"),
    ("http://dx.doi.org/10.1234/abc", "doi:10.1234/abc"),
    ("https://www.doi.org/10.1234/ABC#top", "doi:10.1234/abc"),
    ("HTTPS://DOI.ORG/10.1234/abc", "doi:10.1234/abc"),
    ("  10.1234/abc\n", "doi:10.1234/abc"),
    ("https://doi.org/10.1002/%28SICI%291097-4571", "doi:10.1002/(sici)1097-4571"),
    ("https://doi.org/10.1234/a%2Fb%3Fc", "doi:10.1234/a/b?c"),
    ("https://doi.org/10.1234/x?locatt=mode:legacy", "doi:10.1234/x"),
    ("10.1000.10/xyz", "doi:10.1000.10/xyz"),
    ("10.123456789/z", "doi:10.123456789/z"),
    ("10.1234/a:b;c<d>", "doi:10.1234/a:b;c<d>"),
    ("10.48550/arXiv.2101.00001", "doi:10.48550/arxiv.2101.00001"),
    # arXiv, new and old style, every accepted spelling
    ("2101.00001", "arxiv:2101.00001"),
    ("2101.00001v3", "arxiv:2101.00001"),
    ("arXiv:2101.00001", "arxiv:2101.00001"),
    ("ARXIV:2101.00001v12", "arxiv:2101.00001"),
    ("0704.0001", "arxiv:0704.0001"),
    ("1412.7878", "arxiv:1412.7878"),
    ("https://arxiv.org/abs/2101.00001v2", "arxiv:2101.00001"),
    ("https://arxiv.org/pdf/2101.00001v2.pdf", "arxiv:2101.00001"),
    ("http://export.arxiv.org/pdf/2101.00001", "arxiv:2101.00001"),
    ("hep-th/9901001", "arxiv:hep-th/9901001"),
    ("HEP-TH/9901001v2", "arxiv:hep-th/9901001"),
    ("math.AG/0601001", "arxiv:math/0601001"),
    ("arxiv:math/0601001", "arxiv:math/0601001"),
    ("https://arxiv.org/abs/hep-th/9901001", "arxiv:hep-th/9901001"),
    # URLs
    ("https://example.org/a?b=1", "url:https://example.org/a?b=1"),
    ("HTTPS://Example.ORG/A/B?C=D#frag", "url:https://example.org/A/B?C=D"),
    ("http://example.org", "url:http://example.org/"),
    ("http://example.org:80/x", "url:http://example.org/x"),
    ("https://example.org:443/x", "url:https://example.org/x"),
    ("https://example.org:8443/x", "url:https://example.org:8443/x"),
    ("http://example.org/a?", "url:http://example.org/a"),
    ("https://example.org/a?b=1&b=2&a=", "url:https://example.org/a?b=1&b=2&a="),
    ("https://bücher.example/ä", "url:https://xn--bcher-kva.example/ä"),
    ("http://[2001:DB8::1]:8080/", "url:http://[2001:db8::1]:8080/"),
    ("https://doi.org/", "url:https://doi.org/"),
    ("https://arxiv.org/list/hep-th/new", "url:https://arxiv.org/list/hep-th/new"),
]

REJECTED = [
    ("ftp://x", "scheme"),
    ("javascript:alert(1)", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("10.12/x", "prefix"),
    ("10.1234567890/x", "prefix"),
    ("10.1234/", "suffix is empty"),
    ("10.1234", "no '/'"),
    ("doi:", "no '/'"),
    ("10.1234/a b", "whitespace"),
    ("https://doi.org/10.1234/a%00b", "control"),
    ("http://user:pw@host/", "userinfo"),
    ("http://host@evil.example/", "userinfo"),
    ("", "empty"),
    ("   ", "empty"),
    ("hello world", "not a DOI"),
    ("example.org/paper.pdf", "not a DOI"),
    ("10.1234/abc\x00", "control"),
    ("http://example.org/\x7f", "control"),
    ("http://example.org/a b", "whitespace"),
    ("http:///nohost", "no host"),
    ("http://exa%6Dple.org/", "host"),
    ("http://[::1/", "parsed"),
    ("http://example.org:99999/", "port"),
    ("http://example.org:0/", "port"),
    ("http://[fe80::1%25eth0]/", "zone id"),
    ("\ufeff10.1234/abc", "format character"),
    ("10.1234/abc\u200b", "format character"),
    ("2101.0001", "width"),
    ("1313.00001", "YYMM"),
    ("notes/9901001", "archive"),
    ("arXiv:hello", "not an arXiv id"),
    ("https://arxiv.org/abs/nonsense", "not an arXiv id"),
    ("https://doi.org/10.1/x", "prefix"),
    ("x" * 8193, "bytes"),
    ("\ud800", "UTF-8"),
]


@pytest.mark.parametrize(("value", "key"), ACCEPTED)
def test_accepted_values_map_to_their_key(value, key):
    assert canonical_key(value) == key
    assert classify(value).key == key


@pytest.mark.parametrize(("value", "why"), REJECTED)
def test_rejected_values_say_why(value, why):
    with pytest.raises(InvalidIdentifier) as info:
        canonical_key(value)
    assert why.lower() in str(info.value).lower()
    assert isinstance(info.value, ValueError)  # callers may catch ValueError


@pytest.mark.parametrize("group", [
    ["10.1234/ABC", "https://doi.org/10.1234/abc", "doi:10.1234/abc", "http://dx.doi.org/10.1234/Abc"],
    ["2101.00001", "arXiv:2101.00001v3", "https://arxiv.org/pdf/2101.00001v1.pdf"],
    ["math.AG/0601001", "math/0601001", "https://arxiv.org/abs/math.AG/0601001v2"],
    ["https://example.org", "HTTPS://EXAMPLE.org:443/#x", "https://example.org/?"],
])
def test_equivalent_spellings_share_one_key(group):
    assert len({canonical_key(value) for value in group}) == 1, group


def test_classify_exposes_kind_normalized_and_version():
    assert classify("arXiv:2101.00001v3") == Identifier("arxiv", "2101.00001", "arxiv:2101.00001", 3)
    assert classify("2101.00001").version is None
    assert classify("DOI:10.1234/X") == Identifier("doi", "10.1234/x", "doi:10.1234/x")
    url = classify("https://Example.org/P")
    assert (url.kind, url.normalized, url.key) == ("url", "https://example.org/P", "url:https://example.org/P")
    with pytest.raises(AttributeError):  # frozen: a key cannot drift after it was computed
        url.key = "url:x"


def test_the_limit_is_bytes_not_characters():
    value = "https://example.org/" + "é" * 4087  # 20 + 8174 bytes, 4107 characters
    with pytest.raises(InvalidIdentifier, match="bytes"):
        canonical_key(value)
    assert canonical_key("https://example.org/" + "a" * 8172).startswith("url:")


def test_importing_it_does_not_import_the_master():
    code = ("import sys, workers.wire.canonical; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('app', 'flask')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
