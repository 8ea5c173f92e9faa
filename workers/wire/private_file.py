"""Reading a secret from a file only its owner may read (tokens, keys).

The permission check is made on the file already opened (``fstat``), so the
file checked is the file read, even if the path is swapped in between.
Shared by the worker-side command lines and the master, which add their own
size and content rules and their own error messages.
"""
from __future__ import annotations

import os
import stat


class OpenToOthers(Exception):
    """The file's permissions let the group or others in."""

    def __init__(self, mode: int):
        super().__init__(f"mode {mode:04o}")
        self.mode = mode


def read_private(path: str, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``path`` (so the caller sees an oversized
    file), after checking that only its owner may read or write it.

    Raises:
        OpenToOthers: group or other permission bits are set.
        OSError: the file cannot be opened or read (FileNotFoundError included).
    """
    with open(path, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if mode & 0o077:
            raise OpenToOthers(stat.S_IMODE(mode))
        return fh.read(limit + 1)
