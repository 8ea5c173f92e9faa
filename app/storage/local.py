"""Object store in a local directory: the embedded default (DESIGN §2).

Write path: copy the source into a temp file in the target directory while
hashing it, refuse it unless digest and size match, fsync it, then
``os.link`` it to the final name. ``link`` fails when the name exists, which
makes the write conditional and atomic: the final key never names a
partially written file, and an existing object is never replaced. The
directory is fsynced afterwards so the new name survives a crash.

When the source lies on the same filesystem (the spool next to the store, the
embedded default), it is hard-linked instead of copied: no second write of
the bytes, which are re-hashed through the new name before the link to the
key is made (only measured, when the caller hashed them as it wrote them).

Leftover ``.tmp-*`` files (crash mid-copy) never collide with keys, whose
path parts cannot start with a dot.
"""
from __future__ import annotations

import errno
import hashlib
import os
from typing import BinaryIO

from .base import (CHUNK, ObjectNotFound, ObjectStore, PutResult, StorageUnavailable,
                   check_digest, check_key, hash_stream, source_mismatch, verify_existing)

# Objects are read by the master only; group read lets an operator's backup
# or web-server group read them without making the archive world-readable.
FILE_MODE = 0o640
DIR_MODE = 0o750
# Filesystems without hard links (some FUSE/SMB mounts) answer these.
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalObjectStore(ObjectStore):
    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def __repr__(self) -> str:
        return f"LocalObjectStore({self.root!r})"

    def path_of(self, key: str) -> str:
        """Filesystem path of a key (for serving local objects directly)."""
        return os.path.join(self.root, *check_key(key).split("/"))

    def put_file(self, key: str, path: str, *, sha256_hex: str, size: int,
                 source_hashed: bool = False) -> PutResult:
        digest = check_digest(sha256_hex)
        final = self.path_of(key)
        if self.exists(key):
            return verify_existing(key, self.sha256_of(key), digest, size)
        if self._same_filesystem(path):
            try:
                created = self._link_source(path, final, key, digest, size, source_hashed)
            except OSError as exc:
                if exc.errno not in _NO_LINK:
                    raise StorageUnavailable(f"local object store: {exc}") from exc
            else:
                if created:
                    return PutResult(key=key, existed=False)
                return verify_existing(key, self.sha256_of(key), digest, size)
        # A missing or unreadable source is the caller's problem, not the
        # store's: it propagates as a plain OSError.
        with open(path, "rb") as src:
            try:
                created = self._write_new(src, final, key, digest, size)
            except OSError as exc:
                raise StorageUnavailable(f"local object store: {exc}") from exc
        if created:
            return PutResult(key=key, existed=False)
        # Lost a race with a concurrent writer of the same key.
        return verify_existing(key, self.sha256_of(key), digest, size)

    def _same_filesystem(self, path: str) -> bool:
        try:
            return os.stat(path).st_dev == os.stat(self.root).st_dev
        except OSError:
            return False

    def _link_source(self, path: str, final: str, key: str, digest: str, size: int,
                     source_hashed: bool) -> bool:
        """Zero-copy archive of a spool file on the same filesystem.

        The spool file is already durable and never written again, so it is
        hard-linked under a temp name, checked through that name (the bytes
        that will be the object: re-hashed, or only measured when the caller
        hashed them as it wrote them), and published like a copied file.
        """
        def fill(tmp: str) -> None:
            os.link(path, tmp)
            with open(tmp, "rb") as linked:
                if source_hashed:
                    actual = (digest, os.fstat(linked.fileno()).st_size)
                else:
                    actual = hash_stream(linked)
                    # Read once to check, never again soon: do not keep it cached.
                    os.posix_fadvise(linked.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                self._seal(linked.fileno(), actual, key, digest, size)
        return self._publish(final, fill)

    def _write_new(self, src: BinaryIO, final: str, key: str, digest: str, size: int) -> bool:
        def fill(tmp: str) -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                actual = _copy_hashing(src, out)
                out.flush()
                self._seal(out.fileno(), actual, key, digest, size)
        return self._publish(final, fill)

    @staticmethod
    def _seal(fd: int, actual: tuple[str, int], key: str, digest: str, size: int) -> None:
        if actual != (digest, size):
            raise source_mismatch(key, actual, digest, size)
        os.fchmod(fd, FILE_MODE)
        os.fsync(fd)

    def _publish(self, final: str, fill) -> bool:
        """Let ``fill`` produce a verified temp file, then link it to ``final``
        unless that exists; the temp name is always removed. True if created."""
        directory = os.path.dirname(final)
        self._makedirs(directory)
        tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            fill(tmp)
            created = _link_no_replace(tmp, final)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        _fsync_dir(directory)
        return created

    def _makedirs(self, directory: str) -> None:
        missing = []
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for path in reversed(missing):
            try:
                os.mkdir(path, DIR_MODE)
            except FileExistsError:
                pass
            # A new directory entry is durable only once its parent is synced.
            _fsync_dir(os.path.dirname(path))

    def exists(self, key: str) -> bool:
        try:
            os.stat(self.path_of(key))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StorageUnavailable(f"local object store: {exc}") from exc
        return True

    def open(self, key: str) -> BinaryIO:
        try:
            return open(self.path_of(key), "rb")
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        except OSError as exc:
            raise StorageUnavailable(f"local object store: {exc}") from exc

    def sha256_of(self, key: str) -> tuple[str, int]:
        with self.open(key) as stream:
            try:
                return hash_stream(stream)
            except OSError as exc:
                raise StorageUnavailable(f"local object store: {exc}") from exc

    def delete(self, key: str) -> None:
        path = self.path_of(key)
        try:
            os.unlink(path)
            _fsync_dir(os.path.dirname(path))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageUnavailable(f"local object store: {exc}") from exc

    def presigned_url(self, key: str, expires_s: int) -> str | None:
        return None  # the master serves local objects itself

    def check(self) -> None:
        try:
            os.makedirs(self.root, mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise StorageUnavailable(f"local object store {self.root}: {exc}") from exc
        # access() also reports a read-only mount, even for root.
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageUnavailable(f"local object store {self.root} is not writable")


def _copy_hashing(src: BinaryIO, out: BinaryIO) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        out.write(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _link_no_replace(tmp: str, final: str) -> bool:
    """Give ``tmp`` the name ``final`` unless it exists; True if it was created."""
    try:
        os.link(tmp, final)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    # No hard links here: check, then rename. Two writers racing on the same
    # key could both pass the check; as keys are content addresses and both
    # sources were verified, the loser replaces the object with equal bytes.
    if os.path.lexists(final):
        return False
    os.rename(tmp, final)
    return True
