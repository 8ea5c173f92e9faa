"""The object-store interface shared by the local and S3 backends.

Exception tree::

    StorageError                 anything the store could not do
    ├── StorageUnavailable       retryable: network, timeouts, 5xx, disk I/O
    ├── IntegrityError           bytes do not hash to what was promised
    └── ObjectNotFound           open()/sha256_of() of a key that is absent

Objects are written once and never overwritten: ``put_file`` is a
conditional write, and an object that already exists is re-hashed rather
than trusted (DESIGN §8.6).
"""
from __future__ import annotations

import abc
import hashlib
import re
from dataclasses import dataclass
from typing import BinaryIO
from collections.abc import Iterator

CHUNK = 1024 * 1024
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# Keys become file paths in the local backend, so they are restricted to a
# plain relative path: no "..", no absolute paths, no odd characters.
_KEY_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


class StorageError(Exception):
    """Base of every object-store error."""


class StorageUnavailable(StorageError):
    """The store cannot be reached or failed transiently; retry later."""


class ObjectNotFound(StorageError):
    """The key does not exist."""


class IntegrityError(StorageError):
    """Bytes do not match the expected SHA-256/size.

    ``stored`` is True when an object already in the store differs from the
    expected content (it is left untouched: an operator must look at it), and
    False when the source file itself did not match (nothing was written).
    """

    def __init__(self, message: str, *, key: str, expected: tuple[str, int],
                 actual: tuple[str, int], stored: bool):
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.actual = actual
        self.stored = stored


@dataclass(frozen=True)
class PutResult:
    """Outcome of ``put_file``.

    ``existed`` says the object was already there (nothing was uploaded).
    ``matches`` is always True when ``put_file`` returns: an existing object
    with other content raises ``IntegrityError`` instead, so a caller that
    forgets to look at this field can never register a corrupt object.
    """

    key: str
    existed: bool
    matches: bool = True


def content_key(sha256_hex: str, suffix: str = "pdf") -> str:
    """Content-addressed key ``sha256/ab/cd/<sha256>.pdf`` (DESIGN §8.6); a
    document's original scan keeps its own suffix (``.tif``, ``.png``…)."""
    digest = check_digest(sha256_hex)
    return f"sha256/{digest[0:2]}/{digest[2:4]}/{digest}.{suffix}"


def check_key(key: str) -> str:
    parts = key.split("/")
    if not key or len(key) > 512 or not all(_KEY_PART.match(p) for p in parts):
        raise ValueError(f"invalid object key: {key!r}")
    return key


def check_digest(sha256_hex: str) -> str:
    digest = sha256_hex.lower()
    if not _SHA256_HEX.match(digest):
        raise ValueError("sha256_hex must be 64 hex digits")
    return digest


def hash_stream(stream: BinaryIO) -> tuple[str, int]:
    """SHA-256 and size of a stream, read in chunks (never whole)."""
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def verify_existing(key: str, actual: tuple[str, int], sha256_hex: str, size: int) -> PutResult:
    """Compare a re-hashed existing object with the expected content."""
    if actual != (sha256_hex, size):
        raise IntegrityError(
            f"existing object {key} has sha256 {actual[0]} size {actual[1]}, "
            f"expected {sha256_hex} size {size}",
            key=key, expected=(sha256_hex, size), actual=actual, stored=True)
    return PutResult(key=key, existed=True)


def source_mismatch(key: str, actual: tuple[str, int], sha256_hex: str, size: int) -> IntegrityError:
    return IntegrityError(
        f"source for {key} has sha256 {actual[0]} size {actual[1]}, "
        f"expected {sha256_hex} size {size}; nothing written",
        key=key, expected=(sha256_hex, size), actual=actual, stored=False)


class ObjectStore(abc.ABC):
    """Write-once, content-verified blob storage."""

    @abc.abstractmethod
    def put_file(self, key: str, path: str, *, sha256_hex: str, size: int,
                 source_hashed: bool = False) -> PutResult:
        """Store the file at ``path`` under ``key`` unless the key exists.

        ``source_hashed``: the caller computed ``sha256_hex`` from these very
        bytes as it wrote them, and nothing has written the file since (a
        sealed spool file). Where checking the source would only mean reading
        it once more (a hard link in the local store; S3, whose server checks
        the SHA-256 it is sent), only its size is checked. Copies still hash
        what they write, and an existing object is always re-hashed.

        Raises:
            IntegrityError: the source does not match ``sha256_hex``/``size``
                (nothing written), or an existing object differs (untouched).
            StorageUnavailable: transient failure; safe to call again.
        """

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    @abc.abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A readable binary stream of the object; the caller closes it."""

    def sha256_of(self, key: str) -> tuple[str, int]:
        """Re-hash the stored object by streaming it: ``(hex, size)``."""
        with self.open(key) as stream:
            return hash_stream(stream)

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object if present (tests and admin repair only)."""

    @abc.abstractmethod
    def presigned_url(self, key: str, expires_s: int) -> str | None:
        """A time-limited GET URL, or None when the master must serve it."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise ``StorageUnavailable`` unless the store is usable now."""

    # What an upload spool staged in the store needs (SPOOL_BACKEND=s3):
    # list a prefix, and copy an object inside the store without its bytes
    # passing through the caller.

    def list_keys(self, prefix: str) -> Iterator[tuple[str, float]]:
        """``(key, modified epoch seconds)`` of every object under ``prefix``."""
        raise NotImplementedError(f"{self!r} cannot hold a staging spool")

    def copy(self, source_key: str, key: str, *, sha256_hex: str, size: int) -> PutResult:
        """Store under ``key`` the object at ``source_key``, which must hold
        ``sha256_hex``/``size``; as ``put_file``, never replace an object.

        Raises:
            ObjectNotFound: no object at ``source_key``.
            IntegrityError: the source is not what was promised (nothing
                written), or an existing object differs (untouched).
            StorageUnavailable: transient failure; safe to call again.
        """
        raise NotImplementedError(f"{self!r} cannot hold a staging spool")
