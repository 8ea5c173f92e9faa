"""Is this file a complete PDF? The check of DESIGN §8 step 4, shared by worker and master.

The worker runs it before uploading and the master runs it again on the
spooled upload, so both refuse the same files for the same reasons.

Order, cheapest first (each failure raises :class:`PdfRejected`):

1. size: equal to ``expected_size`` if given (``size_mismatch``: checked first,
   because a transfer that went wrong should be reported as such, not as
   whatever the damaged bytes look like), then within ``min_bytes`` ..
   ``max_bytes`` (``too_small`` / ``too_large``);
2. head: ``%PDF-`` within the first 1024 bytes (``not_pdf``). The PDF spec's
   implementation notes allow leading bytes there, readers (and qpdf, even with
   recovery off) accept them, and servers do prepend a BOM or blank line; an
   HTML page served as a PDF fails anyway;
3. tail: ``%%EOF`` within the last 4 KiB (``no_eof``): most interrupted
   downloads end up here;
4. SHA-256, streamed, compared with ``expected_sha256`` if given
   (``hash_mismatch``);
5. structural parse in a child process (``unparseable``, ``parse_limit``,
   ``parse_timeout``): qpdf (via pikepdf) with recovery off, so a truncated
   file is refused instead of silently repaired, then the equivalent of
   ``qpdf --check`` (every object, every stream decoded, every page's content
   parsed); any warning counts as a failure.

The parse runs in ``python this_file --child ...``, a fresh interpreter rather
than a fork: nothing of the parent's memory, threads or locks is inherited, and
a hostile file (a deflate bomb, a parser bug) can only exhaust the child. The
child sets its own CPU (RLIMIT_CPU) and address-space (RLIMIT_AS) limits before
importing pikepdf (``preexec_fn`` is unsafe in the threaded master and
worker); the parent kills it at the wall-clock limit.

This module imports only the standard library at the top (pikepdf only in the
child), so it never pulls in Flask or ``app``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass

HEAD_WINDOW = 1024
TAIL_WINDOW = 4096
MIN_BYTES = 10 * 1024
MAX_BYTES = 100 * 1024 * 1024

# Child exit codes. Python itself uses 1 (uncaught exception) and 2 (usage),
# so ours are chosen apart from those; anything else means the child crashed.
EXIT_OK = 0
EXIT_REJECTED = 10
EXIT_LIMIT = 11

# Deaths by these signals are the parse hitting a limit: SIGXCPU/SIGKILL from
# RLIMIT_CPU (soft/hard), SIGABRT from an uncaught std::bad_alloc under
# RLIMIT_AS, SIGSEGV/SIGBUS from stack exhaustion on deeply nested input.
# Other signals (SIGTERM at shutdown, say) are not the file's fault.
LIMIT_SIGNALS = {signal.SIGXCPU, signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS}


class PdfRejected(ValueError):
    """The file is not an acceptable PDF; ``reason`` is a short machine code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class PdfCheckError(RuntimeError):
    """The check itself failed (pikepdf missing, child interrupted): not the file's fault."""


@dataclass(frozen=True)
class ParseLimits:
    cpu_seconds: int = 10
    memory_bytes: int = 512 * 1024 * 1024   # address space; Python + pikepdf need ~50 MiB
    wall_seconds: float = 15


@dataclass(frozen=True)
class PdfInfo:
    size: int
    sha256: str
    pages: int | None          # None when called with parse=False
    pdf_version: str           # from the parser, or from the header when parse=False


def sha256_file(path) -> str:
    """Hex SHA-256 of a file, read in chunks (never the whole file in memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_pdf_file(path, *, min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES,
                   expected_size: int | None = None, expected_sha256: str | None = None,
                   parse: bool = True, limits: ParseLimits = ParseLimits()) -> PdfInfo:
    """Check ``path`` as described in the module docstring; return what was learnt.

    Raises :class:`PdfRejected` for a bad file, :class:`PdfCheckError` when the
    check could not be carried out, ``OSError`` when the file cannot be read.
    """
    path = os.path.abspath(os.fspath(path))
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file: {path}")
        size = st.st_size
        if expected_size is not None and size != expected_size:
            raise PdfRejected("size_mismatch", f"file has {size} bytes, expected {expected_size}")
        if size < min_bytes:
            raise PdfRejected("too_small", f"file has {size} bytes, fewer than {min_bytes}")
        if size > max_bytes:
            raise PdfRejected("too_large", f"file has {size} bytes, more than {max_bytes}")

        head = f.read(HEAD_WINDOW)
        start = head.find(b"%PDF-")
        if start < 0:
            raise PdfRejected("not_pdf", f"no %PDF- header in the first {HEAD_WINDOW} bytes"
                                         f" (starts with {head[:16]!r})")
        f.seek(max(0, size - TAIL_WINDOW))
        if b"%%EOF" not in f.read(TAIL_WINDOW):
            raise PdfRejected("no_eof", f"no %%EOF in the last {TAIL_WINDOW} bytes (truncated?)")

        f.seek(0)
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise PdfRejected("hash_mismatch", f"SHA-256 is {digest}, expected {expected_sha256}")

    if not parse:
        version = head[start + 5:start + 8].decode("ascii", "replace")
        return PdfInfo(size=size, sha256=digest, pages=None, pdf_version=version)
    pages, version = _parse_in_child(path, limits)
    return PdfInfo(size=size, sha256=digest, pages=pages, pdf_version=version)


def _parse_in_child(path: str, limits: ParseLimits) -> tuple[int, str]:
    # -P: do not put this file's directory (workers/) first on the child's
    # sys.path, where its modules could shadow the standard library.
    cmd = [sys.executable, "-P", os.path.abspath(__file__), "--child",
           str(max(1, math.ceil(limits.cpu_seconds))), str(int(limits.memory_bytes)), path]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise PdfRejected("parse_timeout",
                          f"parse took longer than {limits.wall_seconds} s; killed") from None
    except BaseException:
        # Interrupted (KeyboardInterrupt, say): never leave the child running.
        proc.kill()
        proc.wait()
        raise

    code = proc.returncode
    try:
        result = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {}
    if code == EXIT_OK and "pages" in result:
        return int(result["pages"]), str(result["version"])
    if code == EXIT_REJECTED:
        raise PdfRejected("unparseable", result.get("error") or "structural parse failed")
    if code == EXIT_LIMIT:
        raise PdfRejected("parse_limit", result.get("error") or "parse ran out of memory")
    if code < 0 and -code in LIMIT_SIGNALS:
        raise PdfRejected("parse_limit", f"parse killed by {signal.Signals(-code).name}"
                                         f" (limits: {limits.cpu_seconds} s CPU,"
                                         f" {limits.memory_bytes} bytes)")
    tail = err.decode(errors="replace").strip()[-500:]
    raise PdfCheckError(f"PDF parser child failed (exit {code}): {tail}")


# --- the child ---------------------------------------------------------------

def _child_main(cpu_seconds: int, memory_bytes: int, path: str) -> int:
    import resource

    # Limits first, before pikepdf (and the file) can use anything. CPU: soft
    # limit sends SIGXCPU, the hard one a second later SIGKILL. No core files.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    import pikepdf   # an ImportError here exits 1: a crash, not a rejection

    def answer(code: int, **fields) -> int:
        print(json.dumps(fields), flush=True)
        return code

    try:
        # attempt_recovery=False: a default open() rebuilds a missing or broken
        # xref table, so a file cut in half would open with all its pages.
        with pikepdf.open(path, attempt_recovery=False) as pdf:
            # qpdf --check: all objects, all streams decoded, all page content
            # parsed; it returns warnings and errors as text (a few ms for a
            # 20 MiB paper; image-heavy files cost more, bounded by the limits).
            problems = pdf.check_pdf_syntax()
            problems += pdf.get_warnings()
            pages, version = len(pdf.pages), str(pdf.pdf_version)
    except MemoryError as exc:
        return answer(EXIT_LIMIT, error=f"out of memory: {exc}")
    except pikepdf.PasswordError:
        return answer(EXIT_REJECTED, error="encrypted with a password")
    except Exception as exc:   # the file's structure broke the parser somewhere
        return answer(EXIT_REJECTED, error=f"{type(exc).__name__}: {exc}"[:1000])

    if problems:
        # qpdf turns a failed allocation while decoding a stream into a warning
        # ("... std::bad_alloc"): that is the memory limit, not a broken file.
        if any("bad_alloc" in p for p in problems):
            return answer(EXIT_LIMIT, error="out of memory decoding a stream: " + problems[0][:500])
        return answer(EXIT_REJECTED, error="; ".join(problems[:3])[:1000])
    return answer(EXIT_OK, pages=pages, version=version)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        sys.exit(_child_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    sys.exit(f"usage: {sys.argv[0]} --child CPU_SECONDS MEMORY_BYTES PATH")
