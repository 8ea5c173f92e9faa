"""Object store for archived files (DESIGN §8.6): local directory or S3.

``from_config`` picks the backend: S3 when ``S3_BUCKET`` is set, otherwise a
local directory (``OBJECT_STORE_DIR``, default ``<DATA_DIR>/objects``). See
``base`` for the interface and the exception tree, docs/storage.md for the
operator's view.
"""
from __future__ import annotations

import os
import threading

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
    "shared_store",
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


_shared: dict[tuple, ObjectStore] = {}
_shared_lock = threading.Lock()


def shared_store(config: dict) -> ObjectStore:
    """The configured store, built once per configuration in this process.
    For the hot paths (each upload staged in S3): an S3 client takes tens of
    milliseconds to build, and one client is safe to share between threads."""
    key = tuple(sorted((k, str(v)) for k, v in config.items()
                       if k.startswith("S3_") or k in ("OBJECT_STORE_DIR", "DATA_DIR")))
    with _shared_lock:
        store = _shared.get(key)
        if store is None:
            store = _shared[key] = from_config(config)
        return store
