"""Sealed copies of machine tokens, so that an admin or the owner can view a
token again while a database dump alone reveals none.

AES-256-GCM under a key derived with HKDF-SHA256 from the application's
secret key. The associated data binds a sealed copy to its user and to the
token's digest: copied onto another row, or left behind when the digest
changes, it no longer opens. Layout: one version byte, the 12-byte nonce,
then ciphertext and tag.
"""
from __future__ import annotations

import functools
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.accounts import tokens

_VERSION = b"\x01"
_NONCE_BYTES = 12
_INFO = b"fleethq machine-token seal v1"


@functools.lru_cache(maxsize=4)
def _cipher(secret_key: str | bytes) -> AESGCM:
    material = secret_key if isinstance(secret_key, bytes) else secret_key.encode(
        "utf-8", "surrogatepass")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(material)
    return AESGCM(key)


def _bound_to(user_id: str, token_hash: str) -> bytes:
    return _VERSION + user_id.encode() + b"\x00" + token_hash.encode()


def seal(secret_key: str | bytes, user_id: str, token_hash: str, token: str) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    sealed = _cipher(secret_key).encrypt(nonce, tokens.token_bytes(token),
                                         _bound_to(user_id, token_hash))
    return _VERSION + nonce + sealed


def unseal(secret_key: str | bytes, user_id: str, token_hash: str, sealed: bytes | None) -> str | None:
    """The token, or None when the copy does not open (another secret key,
    another row, damaged) — never an exception."""
    if not sealed or bytes(sealed[:1]) != _VERSION:
        return None
    sealed = bytes(sealed)
    nonce, body = sealed[1:1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES:]
    try:
        raw = _cipher(secret_key).decrypt(nonce, body, _bound_to(user_id, token_hash))
    except (InvalidTag, ValueError):
        return None
    token = tokens.from_bytes(raw)
    return token if tokens.matches(token, token_hash) else None
