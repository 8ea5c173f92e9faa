"""Secrets: 256-bit random, prefixed, stored as SHA-256, compared in constant time."""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

USER_TOKEN_PREFIX = "fhq_"


def new_secret(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def matches(token: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(token), stored_digest)
