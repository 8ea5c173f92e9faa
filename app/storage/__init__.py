"""Object store for archived files (DESIGN §8.6): local directory or S3.

``from_config`` picks the backend: S3 when ``S3_BUCKET`` is set, otherwise a
local directory (``OBJECT_STORE_DIR``, default ``<DATA_DIR>/objects``). See
``base`` for the interface and the exception tree, docs/storage.md for the
operator's view.
"""
from __future__ import annotations

import os

from .base import (IntegrityError, ObjectNotFound, ObjectStore, PutResult, StorageError,
                   StorageUnavailable, content_key)
from .local import LocalObjectStore

__all__ = [
    "IntegrityError",
    "LocalObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "PutResult",
    "StorageError",
    "StorageUnavailable",
    "content_key",
    "from_config",
]


def from_config(config: dict) -> ObjectStore:
    """Build the configured object store (no network or disk access yet)."""
    if config.get("S3_BUCKET"):
        # Imported lazily: the embedded default should not pay for boto3.
        from .s3 import S3ObjectStore
        return S3ObjectStore.from_config(config)
    root = config.get("OBJECT_STORE_DIR") or os.path.join(
        str(config.get("DATA_DIR") or "var"), "objects")
    return LocalObjectStore(str(root))
