"""The worker volume: one directory that survives restarts (DESIGN §9).

    lock            flock()ed by the running process (two runners never share a volume)
    identity.json   node id + secret, mode 0600, written before registering (§7 step 2)
    journal.json    the results journal (journal.py)
    tmp/            partial downloads; cleared at every start
    ready/          downloaded PDFs waiting for their archive receipt, named <attempt>.pdf
"""
from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path


class VolumeError(Exception):
    """The volume cannot be used; the message says why and what to do."""


class VolumeLocked(VolumeError):
    pass


class VolumeCorrupt(VolumeError):
    pass


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` so that a crash leaves the old or the new content, never
    a mix: temp file, fsync, rename, fsync of the directory (the rename itself
    is only durable once the directory is)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # an older temp file may have had another mode
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


@dataclass
class Identity:
    worker_id: str
    secret: str
    name: str
    master: str
    registered: bool = False

    @staticmethod
    def generate(name: str, master: str) -> "Identity":
        # DESIGN §7: id 16..128 url-safe chars (32 here), secret fhqn_ + 32
        # random bytes in unpadded base64url.
        secret = "fhqn_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        return Identity(new_worker_id(), secret, name, master)


def new_worker_id() -> str:
    """32 random url-safe characters, never starting with "-": admins type the
    id into ``flask fleet worker approve ID``, where a leading dash would be
    read as an option (one id in 64 would start with one)."""
    while True:
        candidate = secrets.token_urlsafe(24)
        if not candidate.startswith("-"):
            return candidate


class Volume:
    def __init__(self, root: Path):
        self.root = Path(root).absolute()
        self.tmp = self.root / "tmp"
        self.ready = self.root / "ready"
        self.identity_path = self.root / "identity.json"
        self.journal_path = self.root / "journal.json"
        self._lock_fd: int | None = None

    def open(self) -> None:
        """Create the layout and take the lock. Raises VolumeLocked/VolumeError."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)  # the identity and the PDFs are nobody else's
            for sub in (self.tmp, self.ready):
                sub.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise VolumeError(f"cannot use volume {self.root}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise VolumeLocked(f"volume {self.root} is in use by another fleethq-worker "
                                   f"(pid {holder}); one runner per volume") from None
            raise VolumeError(f"cannot lock volume {self.root}: {exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd  # held (and the lock with it) until close() or process exit

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- identity ------------------------------------------------------------

    def load_identity(self) -> Identity | None:
        try:
            raw = self.identity_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(raw)
            return Identity(worker_id=str(data["worker_id"]), secret=str(data["secret"]),
                            name=str(data["name"]), master=str(data["master"]),
                            registered=bool(data["registered"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise VolumeCorrupt(f"identity file {self.identity_path} is damaged ({exc}); "
                                "this volume's worker cannot authenticate any more: "
                                "start on a fresh volume with a new enrollment credential") from None

    def save_identity(self, identity: Identity) -> None:
        data = json.dumps(identity.__dict__, indent=1).encode()
        atomic_write(self.identity_path, data, 0o600)

    # --- space ---------------------------------------------------------------

    def disk_free(self) -> int:
        return shutil.disk_usage(self.root).free

    def ready_path(self, attempt_id: str) -> Path:
        return self.ready / f"{attempt_id}.pdf"

    def work_dir(self, attempt_id: str) -> Path:
        """A fresh per-attempt directory for the fetch ladder's partial files."""
        path = self.tmp / attempt_id
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700)
        return path
