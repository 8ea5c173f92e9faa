"""Secrets the master must read again, kept so that a database dump alone
reveals none: machine tokens an admin may view again
(app/accounts/sealing.py), the signing secrets of hook consumers
(app/hooks/consumers.py).

AES-256-GCM under a key derived with HKDF-SHA256 from the application's
secret key, one key per purpose. The associated data binds a sealed value to
its row (the caller says how): copied onto another row it no longer opens.
Layout: one version byte, the 12-byte nonce, then ciphertext and tag.
"""
from __future__ import annotations

import functools
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_VERSION = b"\x01"
_NONCE_BYTES = 12


@functools.lru_cache(maxsize=8)
def _cipher(secret_key: str | bytes, purpose: bytes) -> AESGCM:
    material = secret_key if isinstance(secret_key, bytes) else secret_key.encode(
        "utf-8", "surrogatepass")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(material)
    return AESGCM(key)


def seal(secret_key: str | bytes, purpose: bytes, bound_to: bytes, plain: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return _VERSION + nonce + _cipher(secret_key, purpose).encrypt(nonce, plain, _VERSION + bound_to)


def unseal(secret_key: str | bytes, purpose: bytes, bound_to: bytes, sealed: bytes | None) -> bytes | None:
    """The plain bytes, or None when the value does not open (another secret
    key, another row, damaged) — never an exception."""
    if not sealed or bytes(sealed[:1]) != _VERSION:
        return None
    sealed = bytes(sealed)
    nonce, body = sealed[1:1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES:]
    try:
        return _cipher(secret_key, purpose).decrypt(nonce, body, _VERSION + bound_to)
    except (InvalidTag, ValueError):
        return None


def configured_key(config) -> str | None:
    """The key to seal under, or None when this process made its own
    (no SECRET_KEY): a value sealed under that could never be opened by
    another process or after a restart."""
    if config.get("SECRET_KEY_GENERATED"):
        return None
    return config.get("SECRET_KEY") or None
