"""Site keys: which publisher a job's fetch will reach, decided at enqueue.

- a DOI: its registrant prefix (``10.1016``), one publisher whatever landing
  host the DOI resolves to;
- an arXiv id: ``arxiv.org``;
- an http(s) URL: its registrable domain by the Public Suffix List
  (``www.sciencedirect.com`` -> ``sciencedirect.com``, ``a.example.co.uk``
  -> ``example.co.uk``); an IP address or a host that is itself a public
  suffix (``localhost``) stands for itself;
- a job may name its own key in ``attr.fleethq_site`` (several publishers
  behind one host, or one publisher under several names);
- anything else (a generic project's free-form value, a document's OCR run)
  has no site key and no site's limits apply to it.

The list is the one ``publicsuffixlist`` ships inside its package: nothing is
downloaded at run time, and a release of the package brings a newer list.
"""
from __future__ import annotations

import functools
import ipaddress
import re
from urllib.parse import urlsplit

from publicsuffixlist import PublicSuffixList

from workers.wire.canonical import ARXIV_HOSTS, DOI_HOSTS, InvalidIdentifier, classify

NAMED_ATTR = "fleethq_site"
MAX_KEY_CHARS = 253
ARXIV_SITE = "arxiv.org"
# What an operator or a job may write as a key: a DOI prefix, a domain, a
# name of its own. Lowercase, so "Elsevier" and "elsevier" are one site.
KEY_RE = re.compile(r"[a-z0-9](?:[a-z0-9._:-]{0,251}[a-z0-9])?")

_SUFFIXES = PublicSuffixList()  # the bundled list, read once per process
# The host of an http(s) URL whose authority is a bare ASCII host name and
# maybe a port: what urlsplit(value).hostname gives, lowercased, at a third
# of its cost. Anything else (user info, brackets, spaces, backslashes) takes
# urlsplit.
_PLAIN_HOST = re.compile(r"https?://([A-Za-z0-9.-]+)(?::[0-9]*)?(?=[/?#]|\Z)", re.IGNORECASE)


class InvalidSiteKey(ValueError):
    """A site key named by a job or an operator that is not one; says why."""


def normalize(raw) -> str:
    """An operator's or a job's site key, lowercased and checked."""
    if not isinstance(raw, str):
        raise InvalidSiteKey("a site key must be a string")
    key = raw.strip().lower()
    if not KEY_RE.fullmatch(key):
        raise InvalidSiteKey(f"a site key is 1..{MAX_KEY_CHARS} of a-z 0-9 . _ : - "
                             "(starting and ending with a letter or digit), like 10.1016 or example.org")
    return key


@functools.lru_cache(maxsize=4096)
def for_host(host: str) -> str:
    """The registrable domain of a host (already lowercase and IDNA-encoded)."""
    host = host.rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return _SUFFIXES.privatesuffix(host) or host


def for_value(value: str, attr: dict | None = None) -> str | None:
    """The site key of a job, or None when its value names no site.

    Raises:
        InvalidSiteKey: the job names a key in ``attr.fleethq_site`` that is not one.
    """
    if attr is not None and NAMED_ATTR in attr:
        return normalize(attr[NAMED_ATTR])
    if value[:8].lower().startswith(("http://", "https://")):
        # Most values of a crawl are plain URLs: their host is enough, and
        # reading it is a fifth of a full canonical parse (enqueue pays it
        # per job). doi.org links and non-ASCII hosts take the full parse.
        plain = _PLAIN_HOST.match(value)
        try:
            host = plain[1].lower() if plain is not None else urlsplit(value.strip()).hostname
        except ValueError:  # a bracketed host that is not an IPv6 address
            return None
        if host and host.isascii() and host not in DOI_HOSTS:
            return ARXIV_SITE if host in ARXIV_HOSTS else for_host(host)
    try:
        ident = classify(value)
    except InvalidIdentifier:
        return None
    if ident.kind == "doi":
        return ident.normalized.split("/", 1)[0]
    if ident.kind == "arxiv":
        return ARXIV_SITE
    host = urlsplit(ident.normalized).hostname
    return for_host(host) if host else None
