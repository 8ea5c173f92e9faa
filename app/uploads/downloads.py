"""Time-limited download URLs for archived objects.

S3 stores answer with a presigned URL; the local store is served by the
master itself at ``/api/v1/assets/<object key>`` with an HMAC over the key and
expiry (keyed by the app's secret), so a hook consumer needs no token.
"""
from __future__ import annotations

import hashlib
import hmac
import time


def _mac(secret_key: str, object_key: str, expires: int) -> str:
    return hmac.new(secret_key.encode(), f"{object_key}\n{expires}".encode(), hashlib.sha256).hexdigest()


def signed_path(secret_key: str, object_key: str, expires: int) -> str:
    return f"/api/v1/assets/{object_key}?expires={expires}&sig={_mac(secret_key, object_key, expires)}"


def verify(secret_key: str, object_key: str, expires: str, sig: str) -> bool:
    # compare_digest refuses non-ASCII strings (TypeError): such a sig is no sig.
    if not expires.isascii() or not expires.isdigit() or int(expires) < time.time() or not sig.isascii():
        return False
    return hmac.compare_digest(_mac(secret_key, object_key, int(expires)), sig)


def url_for(store, config, object_key: str, ttl_s: int = 3600) -> tuple[str, int]:
    """(url, expires_at) for a hook payload."""
    expires = int(time.time()) + ttl_s
    presigned = store.presigned_url(object_key, ttl_s)
    if presigned:
        return presigned, expires
    base = (config.get("PUBLIC_URL") or "").rstrip("/")
    return base + signed_path(config["SECRET_KEY"], object_key, expires), expires
