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
   ``parse_timeout``, ``too_inflated``): qpdf (via pikepdf) with recovery
   off, so a truncated file is refused instead of silently repaired; then
   what the streams decode to, counted a chunk at a time and bounded by
   ``ParseLimits`` (a decompression bomb is refused before anything buffers
   it); then the equivalent of ``qpdf --check`` (every object, every stream
   decoded, every page's content parsed); any warning counts as a failure.

The parse never runs in the calling process. Each process keeps a small pool
of *zygotes* (``python this_file --zygote``): fresh interpreters, started
without inheriting the caller's memory, threads or locks, with pikepdf already
imported. For each file a zygote forks a child that sets its own CPU
(RLIMIT_CPU) and address-space (RLIMIT_AS) limits and parses; the zygote kills
it at the wall-clock limit. A hostile file (a deflate bomb, a parser bug) can
only exhaust that child, and the warm zygote saves the ~60 ms of interpreter
start and import that a fresh process per file would cost. A memory limit
below what the parser itself maps is reported as :class:`PdfCheckError`
(misconfiguration), never blamed on the file.

This module imports only the standard library at the top (pikepdf only in the
zygote and its children), so it never pulls in Flask or ``app``.
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
import threading
import time
import zlib
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
EXIT_CANNOT_RUN = 12  # the check could not be carried out (configuration)
EXIT_INFLATED = 13  # the streams decode to more than ParseLimits allows

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
    # What the file's streams may decode to, all together (``too_inflated``):
    # ``inflation_ratio`` times the file's size, but never less than
    # ``inflation_floor`` (a small file of blank greyscale Flate scans inflates
    # a thousandfold and is still a document) nor more than ``inflated_bytes``.
    # Every reader downstream (OCR, indexers, a browser) decodes them too.
    # None: no bound but the memory and CPU limits.
    inflated_bytes: int | None = 2 << 30
    inflation_ratio: int = 100
    inflation_floor: int = 128 << 20

    def inflation_allowed(self, size: int) -> int | None:
        if self.inflated_bytes is None:
            return None
        return min(self.inflated_bytes, max(self.inflation_floor, self.inflation_ratio * size))


@dataclass(frozen=True)
class PdfInfo:
    size: int
    sha256: str
    pages: int | None          # None when called with parse=False
    pdf_version: str           # from the parser, or from the header when parse=False
    font_pages: int | None = None  # pages whose resources name a font: text can be shown there


def sha256_file(path) -> str:
    """Hex SHA-256 of a file, read in chunks (never the whole file in memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_pdf_file(path, *, min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES,
                   expected_size: int | None = None, expected_sha256: str | None = None,
                   parse: bool = True, limits: ParseLimits = ParseLimits(),
                   known_sha256: str | None = None) -> PdfInfo:
    """Check ``path`` as described in the module docstring; return what was learnt.

    ``known_sha256`` is the digest the caller computed from these very bytes as
    it wrote them (the master hashes an upload while streaming it into the
    spool): step 4 then uses it instead of reading the whole file once more.

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

        if known_sha256 is not None:
            digest = known_sha256.lower()
        else:
            f.seek(0)
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise PdfRejected("hash_mismatch", f"SHA-256 is {digest}, expected {expected_sha256}")

    if not parse:
        version = head[start + 5:start + 8].decode("ascii", "replace")
        return PdfInfo(size=size, sha256=digest, pages=None, pdf_version=version)
    pages, version, font_pages = _parse_in_child(path, limits)
    return PdfInfo(size=size, sha256=digest, pages=pages, pdf_version=version, font_pages=font_pages)


def _parse_in_child(path: str, limits: ParseLimits) -> tuple[int, str, int | None]:
    inflated_max = limits.inflation_allowed(os.path.getsize(path))
    code, out, timed_out = _ZYGOTES.run(path, limits, inflated_max)
    if timed_out:
        raise PdfRejected("parse_timeout",
                          f"parse took longer than {limits.wall_seconds} s; killed")
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {}
    if code == EXIT_OK and "pages" in result:
        fonts = result.get("font_pages")
        return int(result["pages"]), str(result["version"]), int(fonts) if fonts is not None else None
    if code == EXIT_REJECTED:
        raise PdfRejected("unparseable", result.get("error") or "structural parse failed")
    if code == EXIT_LIMIT:
        raise PdfRejected("parse_limit", result.get("error") or "parse ran out of memory")
    if code == EXIT_INFLATED:
        raise PdfRejected("too_inflated", result.get("error") or "streams decode to too many bytes")
    if code < 0 and -code in LIMIT_SIGNALS:
        raise PdfRejected("parse_limit", f"parse killed by {signal.Signals(-code).name}"
                                         f" (limits: {limits.cpu_seconds} s CPU,"
                                         f" {limits.memory_bytes} bytes)")
    raise PdfCheckError(f"PDF parser child failed (exit {code}): {out.strip()[-500:]}")


class _Zygote:
    """A pre-started interpreter with pikepdf imported, forking one child per parse.

    Starting Python and importing pikepdf costs ~60 ms of CPU, several times
    the parse of a typical paper; forking a warm, single-threaded process
    costs about a millisecond. Each parse still runs in its own child with
    its own CPU, memory and wall-time limits, so a hostile file can only kill
    that child. The zygote exits when its parent closes its stdin.
    """

    def __init__(self):
        # -P: do not put this file's directory (workers/) first on sys.path.
        self.proc = subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__), "--zygote"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)

    def run(self, path: str, limits: ParseLimits, inflated_max: int | None) -> tuple[int, str, bool]:
        request = {"path": path, "cpu": max(1, math.ceil(limits.cpu_seconds)),
                   "memory": int(limits.memory_bytes), "wall": float(limits.wall_seconds),
                   "inflated": inflated_max}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise PdfCheckError(f"PDF parser zygote is gone: {exc}") from None
        if not line:
            raise PdfCheckError("PDF parser zygote exited")
        reply = json.loads(line)
        return int(reply["code"]), reply["out"], bool(reply["timeout"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class _ZygotePool:
    """Idle zygotes of this process; one per concurrent parse, reused after."""

    def __init__(self):
        self._idle: list[_Zygote] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def run(self, path: str, limits: ParseLimits, inflated_max: int | None) -> tuple[int, str, bool]:
        zygote = self._take()
        try:
            result = zygote.run(path, limits, inflated_max)
        except BaseException:
            zygote.close()  # its state is unknown: never reuse it
            raise
        with self._lock:
            self._idle.append(zygote)
        return result

    def _take(self) -> _Zygote:
        with self._lock:
            if self._pid != os.getpid():  # forked (gunicorn): the pipes are not ours
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                zygote = self._idle.pop()
                if zygote.alive():
                    return zygote
        return _Zygote()


_ZYGOTES = _ZygotePool()


def _zygote_main() -> int:
    import select

    import pikepdf  # noqa: F401  (warm: every forked child finds it imported)

    for line in sys.stdin:
        request = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: answer on the pipe, never return into the loop
            os.close(read_end)
            os.dup2(write_end, 1)
            try:
                code = _child_main(request["cpu"], request["memory"], request["path"],
                                   request.get("inflated"))
            except BaseException:
                code = 1
            sys.stdout.flush()
            os._exit(code)
        os.close(write_end)
        out, timed_out = bytearray(), False
        deadline = time.monotonic() + request["wall"]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([read_end], [], [], left)
            if ready:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                out += chunk[: max(0, 65536 - len(out))]
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        reply = {"code": os.waitstatus_to_exitcode(status), "timeout": timed_out,
                 "out": out.decode(errors="replace")}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


def _address_space_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# --- the child ---------------------------------------------------------------

def _child_main(cpu_seconds: int, memory_bytes: int, path: str, inflated_max: int | None = None) -> int:
    import resource

    # A limit below what the (warm) parser process already maps would fail
    # every file: that is a misconfiguration, not the file's fault.
    mapped = _address_space_bytes()
    if mapped is not None and memory_bytes <= mapped:
        print(json.dumps({"error": f"memory limit {memory_bytes} is below the parser's own "
                                   f"{mapped} bytes"}), flush=True)
        return EXIT_CANNOT_RUN

    # Limits first, before pikepdf (and the file) can use anything. CPU: soft
    # limit sends SIGXCPU, the hard one a second later SIGKILL. No core files.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    import pikepdf   # an ImportError here exits 1: a crash, not a rejection

    def answer(code: int, **fields) -> int:
        # qpdf names the file in its messages: a message goes back to the
        # uploader, who has no business knowing where the master keeps it.
        if "error" in fields:
            fields["error"] = fields["error"].replace(path, "the file")
        print(json.dumps(fields), flush=True)
        return code

    try:
        # attempt_recovery=False: a default open() rebuilds a missing or broken
        # xref table, so a file cut in half would open with all its pages.
        with pikepdf.open(path, attempt_recovery=False) as pdf:
            # First, cheaply: what the streams inflate to (a decompression
            # bomb is refused before qpdf buffers any of it).
            if inflated_max is not None:
                inflated = _inflated_total(pikepdf, pdf, inflated_max)
                if inflated > inflated_max:
                    size = os.path.getsize(path)
                    return answer(EXIT_INFLATED, error=(
                        f"its streams decode to more than {inflated_max} bytes "
                        f"({inflated_max // max(1, size)}x the file's {size}); refused as a "
                        f"decompression bomb"))
            # qpdf --check: all objects, all streams decoded, all page content
            # parsed; it returns warnings and errors as text (a few ms for a
            # 20 MiB paper; image-heavy files cost more, bounded by the limits).
            problems = pdf.check_pdf_syntax()
            problems += pdf.get_warnings()
            pages, version = len(pdf.pages), str(pdf.pdf_version)
            # A text layer (an OCR output's, say) needs a font on its page;
            # reading each page's resource dictionary costs microseconds.
            font_pages = sum(1 for page in pdf.pages if _has_font(page))
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
    return answer(EXIT_OK, pages=pages, version=version, font_pages=font_pages)


_FLATE = frozenset({"/FlateDecode", "/Fl"})
_EXPANDING = frozenset({"/LZWDecode", "/LZW", "/RunLengthDecode", "/RL"})
_INFLATE_CHUNK = 1 << 20


def _inflated_total(pikepdf, pdf, stop_after: int) -> int:
    """What the file's streams decode to, summed, counting stops once past
    ``stop_after``. Flate layers are inflated here a chunk at a time (nothing
    is held whole); a chain that also has an expanding filter (LZW,
    RunLength) is decoded by qpdf, within the child's memory limit. What the
    image filters after that (DCT, JBIG2, CCITT) make of it is the reader's
    business: counted as it comes out of the Flate stages."""
    total = 0
    for obj in pdf.objects:
        if not isinstance(obj, pikepdf.Stream):
            continue
        filters = obj.get("/Filter")
        names = ([str(f) for f in filters] if isinstance(filters, pikepdf.Array)
                 else [] if filters is None else [str(filters)])
        try:
            if any(name in _EXPANDING for name in names):
                total += len(obj.read_bytes(pikepdf.StreamDecodeLevel.specialized))
            else:
                lead = next((i for i, name in enumerate(names) if name not in _FLATE), len(names))
                if lead:
                    total += _inflated_size(obj.read_raw_bytes(), lead, stop_after - total)
                else:  # nothing to inflate: its length, without copying the bytes out
                    total += int(obj.get("/Length", 0))
        except (pikepdf.PdfError, zlib.error, ValueError):
            continue  # a stream that does not decode: qpdf's check names it
        if total > stop_after:
            break
    return total


def _inflated_size(data: bytes, layers: int, budget: int) -> int:
    """Bytes ``data`` inflates to through ``layers`` Flate layers; stops
    (returning more than ``budget``) as soon as the count passes it."""
    decoders = [zlib.decompressobj() for _ in range(layers)]
    total = 0

    def feed(level: int, chunk: bytes) -> bool:  # False: past the budget, stop
        nonlocal total
        if level == layers:
            total += len(chunk)
            return total <= budget
        decoder = decoders[level]
        while True:
            out = decoder.decompress(chunk, _INFLATE_CHUNK)
            if out and not feed(level + 1, out):
                return False
            chunk = decoder.unconsumed_tail
            if not out or (not chunk and len(out) < _INFLATE_CHUNK):
                return True  # input used up (or the stream ended) and nothing more pending

    feed(0, data)
    return total


def _has_font(page) -> bool:
    """A font in the page's resources, or in those of a form it draws (an
    OCR text layer is usually such a form, one level down)."""
    try:
        return _fonts_in(page.resources, depth=2)
    except Exception:  # noqa: BLE001 - an odd resource tree is not a text layer
        return False


def _fonts_in(resources, depth: int) -> bool:
    if resources is None:
        return False
    fonts = resources.get("/Font")
    if fonts is not None and len(fonts.keys()) > 0:
        return True
    forms = resources.get("/XObject") if depth > 0 else None
    for name in list(forms.keys())[:64] if forms is not None else ():
        form = forms[name]
        if form.get("/Subtype") == "/Form" and _fonts_in(form.get("/Resources"), depth - 1):
            return True
    return False


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--zygote":
        sys.exit(_zygote_main())
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        sys.exit(_child_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                             ParseLimits().inflation_allowed(os.path.getsize(sys.argv[4]))))
    sys.exit(f"usage: {sys.argv[0]} --child CPU_SECONDS MEMORY_BYTES PATH")
