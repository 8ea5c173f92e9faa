"""Sealed copies of machine tokens, so that an admin or the owner can view a
token again while a database dump alone reveals none (app/sealing.py).

The associated data binds a sealed copy to its user and to the token's
digest: copied onto another row, or left behind when the digest changes, it
no longer opens.
"""
from __future__ import annotations

from app import sealing
from app.accounts import tokens

_PURPOSE = b"fleethq machine-token seal v1"


def _bound_to(user_id: str, token_hash: str) -> bytes:
    return user_id.encode() + b"\x00" + token_hash.encode()


def seal(secret_key: str | bytes, user_id: str, token_hash: str, token: str) -> bytes:
    return sealing.seal(secret_key, _PURPOSE, _bound_to(user_id, token_hash), tokens.token_bytes(token))


def unseal(secret_key: str | bytes, user_id: str, token_hash: str, sealed: bytes | None) -> str | None:
    """The token, or None when the copy does not open (another secret key,
    another row, damaged) — never an exception."""
    raw = sealing.unseal(secret_key, _PURPOSE, _bound_to(user_id, token_hash), sealed)
    if raw is None:
        return None
    token = tokens.from_bytes(raw)
    return token if tokens.matches(token, token_hash) else None
