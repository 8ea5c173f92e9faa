"""Secrets: 256-bit random, prefixed, stored as SHA-256, compared in constant time.

User machine tokens may also be chosen by an operator (a SavewebHQ ``hq_…``
token carried over, a token file made by hand): any string of 1..1024 bytes
without whitespace is one, the rule SavewebHQ applies to bearer tokens.

A token is its bytes. Strings that come from HTTP headers or token files
carry bytes that are not UTF-8 as lone surrogates (``surrogateescape``), so
the digest of a token sent by a client equals the digest of the same bytes
read from a file.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

USER_TOKEN_PREFIX = "fhq_"
MAX_TOKEN_BYTES = 1024
# A token imported from SavewebHQ without its clear text is stored under
# SavewebHQ's own digest (SHA-256 of a prefixed token), tagged so that it
# cannot collide with FleetHQ's digests.
SAVEWEBHQ_DIGEST_TAG = "savewebhq-v1:"
_SAVEWEBHQ_DIGEST_PREFIX = b"saveweb-machine-token-v1\x00"
# What SavewebHQ refuses inside a bearer token.
_WHITESPACE = re.compile("[ \t\r\n]")


def new_secret(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def token_bytes(token: str) -> bytes:
    try:
        return token.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no decoder made: keep it hashable
        return token.encode("utf-8", "surrogatepass")


def from_bytes(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def digest(token: str) -> str:
    return hashlib.sha256(token_bytes(token)).hexdigest()


def savewebhq_digest(token: str) -> bytes:
    """SavewebHQ's own digest of a token (its ``tracker_machine_tokens.token_hash``)."""
    return hashlib.sha256(_SAVEWEBHQ_DIGEST_PREFIX + token_bytes(token)).digest()


def savewebhq_key_of(saveweb_digest: bytes) -> str:
    """The ``token_hash`` under which a token known only by its SavewebHQ
    digest is stored."""
    return SAVEWEBHQ_DIGEST_TAG + saveweb_digest.hex()


def savewebhq_key(token: str) -> str:
    """Where a token imported by its SavewebHQ digest only is looked up."""
    return savewebhq_key_of(savewebhq_digest(token))


def matches(token: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(token), stored_digest)


def well_formed(token: str) -> bool:
    """A bearer token SavewebHQ would look up: 1..1024 bytes, no whitespace."""
    return 0 < len(token_bytes(token)) <= MAX_TOKEN_BYTES and _WHITESPACE.search(token) is None


def refusal(token: str) -> str | None:
    """Why ``token`` cannot be installed as a user machine token, or None.

    Stricter than :func:`well_formed` only where a token could never be
    presented: HTTP header values cannot carry control characters.
    """
    if not well_formed(token):
        return f"a machine token is 1..{MAX_TOKEN_BYTES} bytes without spaces or line breaks"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in token):
        return "a machine token cannot contain control characters"
    return None


def from_header(value: str) -> str:
    """A header value as the bytes the client sent (WSGI decodes them as latin-1)."""
    try:
        return from_bytes(value.encode("latin-1"))
    except UnicodeEncodeError:
        return value
