"""Canonical asset keys for job values (DESIGN §1, §4.2, §9).

A job value names a paper as a DOI, an arXiv id or an http(s) URL. Two values
that name the same thing must give the same key, so the master can dedupe
assets and the worker can name its files the same way.

Rules, applied to the value after trimming surrounding whitespace:

- Any value: 1..8192 UTF-8 bytes; control characters (NUL, C0, DEL, C1) and
  invisible format characters (Unicode Cf: BOM, zero-width space, bidi
  controls) are rejected, also when they come out of percent-decoding.
- DOI: ``10.1234/abc``, ``doi:10.1234/abc`` (prefix in any case), or a link
  on ``doi.org``, ``dx.doi.org`` or ``www.doi.org`` (http or https) whose path
  is percent-decoded; the link's query and fragment are ignored. The prefix
  is ``10.`` + 4-9 digits with optional dotted sub-prefixes (``10.1000.10``);
  the suffix is non-empty and has no whitespace. DOIs are case-insensitive, so
  the whole DOI is lowercased. Key ``doi:10.1234/abc``.
- arXiv: new style ``YYMM.NNNN`` (0704-1412) or ``YYMM.NNNNN`` (1501 on), old
  style ``archive[.SC]/YYMMNNN`` of a 1991-2007 archive (``hep-th/9901001``,
  ``math.AG/0601001``), each with an optional ``vN``; written bare, after
  ``arXiv:`` (any case), or as an ``arxiv.org/abs/<id>`` or
  ``arxiv.org/pdf/<id>[.pdf]`` link. The
  version is dropped from the key (a key names the paper, not a revision) but
  kept in :attr:`Identifier.version`. Old-style archives are lowercased and
  the subject class is dropped, as in arXiv's own preferred form
  (``math.AG/0601001`` -> ``arxiv:math/0601001``). Key ``arxiv:2101.00001``.
- URL: http and https only; no userinfo (``user:pw@``); scheme and host
  lowercased, non-ASCII hosts IDNA-encoded (UTS #46, like browsers), default
  ports dropped, fragment dropped, path case kept (an empty path becomes
  ``/``), query kept as is (an empty ``?`` is dropped); whitespace inside is
  rejected. doi.org and arxiv.org links of the forms above map to their
  doi/arxiv keys. Key ``url:https://example.org/a?b=1``.

Anything else raises :class:`InvalidIdentifier` (a ``ValueError``) saying why.
This module must not import ``app`` or Flask: both sides use it.
"""
from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import idna  # a hard dependency of requests, which master and worker both install

__all__ = ["Identifier", "InvalidIdentifier", "canonical_key", "classify"]

MAX_VALUE_BYTES = 8192
DOI_HOSTS = frozenset({"doi.org", "dx.doi.org", "www.doi.org"})
ARXIV_HOSTS = frozenset({"arxiv.org", "www.arxiv.org", "export.arxiv.org"})
DEFAULT_PORTS = {"http": 80, "https": 443}

_DOI_PREFIX_RE = re.compile(r"10\.\d{4,9}(?:\.\d+)*")
_ARXIV_NEW_RE = re.compile(r"(\d{2})(\d{2})\.(\d{4,5})(?:v(\d+))?", re.I)
_ARXIV_OLD_RE = re.compile(r"([a-z]+(?:-[a-z]+)?)(?:\.[a-z]{2})?/(\d{2})(\d{2})(\d{3})(?:v(\d+))?", re.I)
_ARXIV_PATH_RE = re.compile(r"/(?:abs|pdf)/(.+?)(?:\.pdf)?/?")
# The old scheme closed in 2007, so its archive list is final; checking it keeps
# "notes/1234567" from becoming an arXiv key.
ARXIV_OLD_ARCHIVES = frozenset("""
    acc-phys adap-org alg-geom ao-sci astro-ph atom-ph bayes-an chao-dyn chem-ph
    cmp-lg comp-gas cond-mat cs dg-ga funct-an gr-qc hep-ex hep-lat hep-ph hep-th
    math math-ph mtrl-th nlin nucl-ex nucl-th patt-sol physics plasm-ph q-alg
    q-bio quant-ph solv-int supr-con""".split())
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_ASCII_HOST_RE = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")


class InvalidIdentifier(ValueError):
    """The value is not a DOI, an arXiv id or an http(s) URL; the message says why."""


@dataclass(frozen=True)
class Identifier:
    kind: str  # 'doi' | 'arxiv' | 'url'
    normalized: str  # the key without its 'kind:' prefix
    key: str
    version: int | None = None  # arXiv only: the vN the value named, if any


def canonical_key(value: str) -> str:
    return classify(value).key


def classify(value: str) -> Identifier:
    if not isinstance(value, str):
        raise InvalidIdentifier(f"value must be a string, not {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON "\ud800"
        raise InvalidIdentifier("value is not valid UTF-8") from None
    if size > MAX_VALUE_BYTES:
        raise InvalidIdentifier(f"value is {size} bytes; at most {MAX_VALUE_BYTES} allowed")
    text = value.strip()
    if not text:
        raise InvalidIdentifier("value is empty")
    _reject_controls(text)
    lowered = text.lower()
    if lowered.startswith("doi:"):
        return _doi(text[4:].lstrip())
    if lowered.startswith("arxiv:"):
        return _arxiv(text[6:].lstrip())
    if _SCHEME_RE.match(text):  # digits can't start a scheme, so "10.1234/a:b" stays a DOI
        return _url(text)
    if text.startswith("10."):
        return _doi(text)
    if _ARXIV_NEW_RE.fullmatch(text) or _ARXIV_OLD_RE.fullmatch(text):
        return _arxiv(text)
    raise InvalidIdentifier("not a DOI (10.…), an arXiv id or an http(s) URL")


def _reject_controls(text: str) -> None:
    # Cf too: invisible characters (BOM, zero-width space, bidi overrides) would
    # give one paper a second key that looks identical on the admin pages.
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf"):
            raise InvalidIdentifier(f"value contains control or format character U+{ord(ch):04X}")


def _doi(text: str) -> Identifier:
    prefix, slash, suffix = text.partition("/")
    if not slash:
        raise InvalidIdentifier("DOI has no '/' between prefix and suffix")
    if not _DOI_PREFIX_RE.fullmatch(prefix):
        raise InvalidIdentifier(f"DOI prefix {prefix!r} is not '10.' followed by 4-9 digits")
    if not suffix:
        raise InvalidIdentifier("DOI suffix is empty")
    if any(ch.isspace() for ch in suffix):
        raise InvalidIdentifier("DOI contains whitespace")
    doi = f"{prefix}/{suffix}".lower()
    return Identifier("doi", doi, f"doi:{doi}")


def _arxiv(text: str) -> Identifier:
    if m := _ARXIV_NEW_RE.fullmatch(text):
        yymm, month, number = m[1] + m[2], int(m[2]), m[3]
        if not 1 <= month <= 12 or yymm < "0704":
            raise InvalidIdentifier(f"arXiv id {text!r} has no valid YYMM (0704 or later)")
        # Four-digit numbers ran until 1412, five-digit ones since 1501: a wrong
        # width is a typo, and accepting it would give the paper a second key.
        if len(number) != (4 if yymm < "1501" else 5):
            raise InvalidIdentifier(f"arXiv id {text!r} has the wrong number width for {yymm}")
        ident, version = f"{yymm}.{number}", m[4]
    elif m := _ARXIV_OLD_RE.fullmatch(text):
        if m[1].lower() not in ARXIV_OLD_ARCHIVES:
            raise InvalidIdentifier(f"arXiv id {text!r} names no old-style arXiv archive")
        if not 1 <= int(m[3]) <= 12:
            raise InvalidIdentifier(f"arXiv id {text!r} has no valid month")
        ident, version = f"{m[1].lower()}/{m[2]}{m[3]}{m[4]}", m[5]
    else:
        raise InvalidIdentifier(f"{text!r} is not an arXiv id (YYMM.NNNNN or archive/YYMMNNN)")
    return Identifier("arxiv", ident, f"arxiv:{ident}", int(version) if version else None)


def _url(text: str) -> Identifier:
    if any(ch.isspace() for ch in text):
        raise InvalidIdentifier("URL contains whitespace")
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. an unclosed "[" of an IPv6 literal
        raise InvalidIdentifier(f"URL cannot be parsed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidIdentifier(f"URL scheme {scheme!r} is not allowed; only http and https")
    if "@" in parts.netloc:  # credentials would leak into keys and logs; also a phishing trick
        raise InvalidIdentifier("URL must not contain userinfo (user:password@)")
    host = _host(parts)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise InvalidIdentifier("URL port is not a number in 1-65535")

    if host in DOI_HOSTS:
        try:
            path = unquote(parts.path, errors="strict")
        except UnicodeDecodeError:
            raise InvalidIdentifier("DOI link is not valid UTF-8 after percent-decoding") from None
        _reject_controls(path)
        if path.startswith("/10."):
            return _doi(path[1:])
    if host in ARXIV_HOSTS and (m := _ARXIV_PATH_RE.fullmatch(parts.path)):
        return _arxiv(m[1])

    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != DEFAULT_PORTS[scheme]:
        netloc += f":{port}"
    url = f"{scheme}://{netloc}{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")
    return Identifier("url", url, f"url:{url}")


def _host(parts) -> str:
    raw = parts.hostname  # already lowercased, brackets and port removed
    if not raw:
        raise InvalidIdentifier("URL has no host")
    if parts.netloc.startswith("["):
        if "%" in raw:  # a zone id only means something on the machine that wrote it
            raise InvalidIdentifier("URL host must not carry an IPv6 zone id")
        try:
            return ipaddress.IPv6Address(raw).compressed
        except ValueError:
            raise InvalidIdentifier(f"URL host [{raw}] is not an IPv6 address") from None
    if not raw.isascii():
        try:
            # UTS #46 non-transitional, as browsers do: "faß.de" stays distinct from "fass.de".
            raw = idna.encode(raw, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise InvalidIdentifier(f"URL host is not a valid internationalized name: {exc}") from None
    # Underscores are invalid in DNS host names but real in the wild; anything
    # else (backslashes, '%', ...) is how parsers get fooled, so it is refused.
    if not _ASCII_HOST_RE.fullmatch(raw):
        raise InvalidIdentifier(f"URL host {raw!r} is not a valid host name")
    return raw
