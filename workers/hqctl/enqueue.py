"""``hqctl enqueue`` and ``hqctl enqueue-source``, as SavewebHQ's hqctl runs them
(parity H7–H18).

``enqueue`` reads the project first, then sends the jobs in sequential batches
of ``--batch-size`` (any positive count; a batch is cut earlier when its body
would reach the master's 8 MiB limit). Each batch commits on its own, so an
error reports how many jobs earlier batches submitted. ``enqueue-source``
streams a packed file (or stdin) as one request.

This module must not import ``app`` (it runs on worker computers).
"""
from __future__ import annotations

import json
import os
import stat
import sys
import time

from workers.cli.http import ApiError, CliError, Progress, UploadBody, UsageError, segment
from workers.wire.protocol import IDENTITY_MODES
from workers.sdk._retry import DEFAULT as RETRY
from workers.cli.spec_input import InputError, SpecInput

# The master refuses enqueue bodies over 8 MiB; the margin covers the envelope.
MAX_BATCH_BODY = 8 * 1024 * 1024 - 4096
DEFAULT_BATCH_SIZE = 1000
DEFAULT_MAX_JOBS = 10_000_000
DEFAULT_PROGRESS_EVERY = 100


def _emit(obj) -> int:
    if obj:
        print(json.dumps(obj, ensure_ascii=False, indent=2 if sys.stdout.isatty() else None))
    return 0


def project_and_inputs(args, *, max_inputs: int | None = None) -> tuple[str, list[str]]:
    """``--project-id P --input F`` (SavewebHQ's spelling) or FleetHQ's
    positional ``PROJECT [FILE ...]``."""
    words = list(args.inputs)
    project = args.project_id
    if project is None:
        if not words:
            raise UsageError(f"{args.command}: --project-id is required")
        project = words.pop(0)
    inputs = list(args.input or []) + words
    if max_inputs is not None and len(inputs) > max_inputs:
        raise UsageError(f"{args.command}: give one --input")
    return project, inputs


# --- enqueue -------------------------------------------------------------------------

def _should_retry(err: ApiError, mode: str) -> bool:
    """Whether resending a batch cannot create jobs twice, and may succeed."""
    if mode == "none":
        # Every submission makes new jobs, so resend only when the batch
        # surely was not applied: the master said so, or it was never reached.
        return (err.enveloped and err.retryable) if err.status is not None else not err.connected
    if err.status is None:
        return True
    return err.status == 429 or err.status >= 500 or err.retryable


def _pause(attempt: int, err: ApiError) -> float | None:
    """The SDK's pause before resending (None: the master asks for a longer
    wait than the policy allows, so the error is reported instead)."""
    hint = None if err.retry_after_ms is None else err.retry_after_ms / 1000
    return RETRY.pause(attempt, hint, server_error=err.status is not None and err.status >= 500)


def _post_batch(client, path: str, parts: list[bytes], mode: str, args) -> dict:
    body = b'{"jobs":[' + b",".join(parts) + b"]}"
    attempt = 0
    while True:
        try:
            return client.request("POST", path, data=body,
                                  headers={"Content-Type": "application/json"})
        except ApiError as err:
            pause = _pause(attempt, err)
            if attempt >= args.retries or not _should_retry(err, mode) or pause is None:
                raise
            time.sleep(pause)
            attempt += 1


def _checked(result: dict, project: str, sent: int) -> bool:
    """SavewebHQ's check of a batch answer: this project, every job counted."""
    inserted = result.get("inserted")
    return (result.get("project_id") == project and result.get("submitted") == sent
            and isinstance(inserted, int) and 0 <= inserted <= sent)


def _fail(message: str, totals: dict, error: dict | None = None, **extra) -> int:
    """The error line, then one JSON line with what was committed; exit 1."""
    print(f"hqctl: enqueue: {message}", file=sys.stderr)
    report = {"error": error or {"code": "invalid_job", "message": message},
              "submitted": totals["submitted"], "committed": totals["submitted"],
              "inserted": totals["inserted"], "batches": totals["batches"], **extra}
    print(json.dumps(report, ensure_ascii=False), file=sys.stderr)
    return 1


def _check_enqueue_args(args) -> None:
    if args.batch_size < 1 or args.max_jobs < 1 or args.progress_every < 0 or args.retries < 0:
        raise UsageError("enqueue: --batch-size and --max-jobs must be positive, "
                         "--progress-every and --retries not negative")
    if args.type is not None and args.format == "jsonl":
        raise UsageError("enqueue: --type applies to --format values; JSONL jobs carry their type")


def _open_specs(args, project: str, inputs: list[str], mode: str) -> SpecInput:
    default_ids = args.default_ids if args.default_ids is not None else mode == "external_id"
    if default_ids and mode != "external_id":
        raise UsageError(f"enqueue: --default-ids only applies to external_id projects "
                         f"({project} is {mode})")
    return SpecInput(inputs, mode, jsonl=args.format == "jsonl", default_ids=default_ids,
                     allow_random_key=True, job_type=args.type or "seed")


def _count_jobs(specs: SpecInput, max_jobs: int) -> None:
    """Check every line of regular files before anything is sent, so a typo
    near the end of a big file does not leave the project half-filled."""
    count = 0
    for _ in specs:
        count += 1
        if count > max_jobs:
            raise InputError(f"input exceeds --max-jobs {max_jobs}")
    if not count:
        raise InputError("input contains no jobs")


class _Batches:
    """Collects encoded jobs and sends them, keeping the running totals."""

    def __init__(self, client, project: str, mode: str, args, progress):
        self.client, self.project, self.mode, self.args = client, project, mode, args
        self.path = f"admin/projects/{segment(project)}/jobs"
        self.progress = progress
        self.totals = {"submitted": 0, "inserted": 0, "batches": 0}
        self.parts: list[bytes] = []
        self.wheres: list[str] = []
        self.size = 0

    def add(self, where: str, part: bytes) -> None:
        if self.parts and self.size + len(part) + 1 > MAX_BATCH_BODY:
            self.send()
        self.parts.append(part)
        self.wheres.append(where)
        self.size += len(part) + 1
        if len(self.parts) >= self.args.batch_size:  # a full batch goes at once, as SavewebHQ's
            self.send()

    def send(self) -> None:
        if not self.parts:
            return
        result = _post_batch(self.client, self.path, self.parts, self.mode, self.args)
        if not _checked(result, self.project, len(self.parts)):
            raise CliError(f"batch {self.totals['batches'] + 1} returned an invalid response "
                           f"after {self.totals['submitted']} submitted jobs")
        self.totals["submitted"] += result["submitted"]
        self.totals["inserted"] += result["inserted"]
        self.totals["batches"] += 1
        self.parts.clear()
        self.wheres.clear()
        self.size = 0
        self.progress(self.totals)


def _progress_reporter(args, specs: SpecInput, project: str):
    """FleetHQ's self-rewriting bar (share of the input read, jobs sent and
    new, elapsed time, ETA) when stderr is a terminal or with ``--progress``;
    else SavewebHQ's stderr line every ``--progress-every`` batches, which
    logs and pipes read."""
    if args.progress or (args.progress is None and sys.stderr.isatty()):
        bar = Progress(f"enqueue {project}", total=specs.total_bytes, enabled=True)

        def draw(totals):
            bar.update(specs.bytes_read, f"{totals['submitted']} jobs, {totals['inserted']} new",
                       force=True)
        return draw, bar.close
    every = 0 if args.progress is False else args.progress_every

    def line(totals):
        if every and totals["batches"] % every == 0:
            print(f"batches={totals['batches']} submitted={totals['submitted']} "
                  f"inserted={totals['inserted']}", file=sys.stderr, flush=True)
    return line, lambda: None


def cmd_enqueue(client, args):
    _check_enqueue_args(args)
    project, inputs = project_and_inputs(args)
    try:
        summary = client.request("GET", f"admin/projects/{segment(project)}")
    except ApiError as err:
        raise CliError(f"enqueue: get project: {err.line()}") from None
    mode = summary.get("identity_mode")
    if mode not in IDENTITY_MODES:
        raise CliError(f"enqueue: project has unknown identity mode {mode!r}")
    project = summary.get("id") or project
    empty = {"submitted": 0, "inserted": 0, "batches": 0}
    specs = _open_specs(args, project, inputs, mode)
    if specs.rereadable:
        try:
            _count_jobs(specs, args.max_jobs)
        except InputError as exc:
            return _fail(str(exc), empty)
        specs = _open_specs(args, project, inputs, mode)
    report, finish = _progress_reporter(args, specs, project)
    batches = _Batches(client, project, mode, args, report)
    jobs = 0
    try:
        try:
            for where, spec in specs:
                jobs += 1
                if jobs > args.max_jobs:
                    raise InputError(f"input exceeds --max-jobs {args.max_jobs}")
                try:
                    part = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode()
                except UnicodeEncodeError:  # lone surrogates from \ud800 escapes
                    raise InputError(f"{where}: job is not valid UTF-8") from None
                batches.add(where, part)
            if not jobs:
                raise InputError("input contains no jobs")
            batches.send()
        finally:
            finish()
    except InputError as exc:
        return _fail(f"{exc} (after {batches.totals['submitted']} submitted jobs)", batches.totals)
    except ApiError as err:
        return _fail_batch(err, batches, mode)
    except CliError as exc:  # an answer that does not add up
        return _fail(str(exc), batches.totals, {"code": "invalid_response", "message": str(exc)})
    return _emit({"project_id": project, "identity_mode": mode, **batches.totals})


def _fail_batch(err: ApiError, batches: _Batches, mode: str) -> int:
    totals, wheres = batches.totals, batches.wheres
    extra = {"failed_batch_starts_at": wheres[0]} if wheres else {}
    index = err.details.get("index")
    if isinstance(index, int) and 0 <= index < len(wheres):
        extra["failed_job_at"] = wheres[index]
    if err.status is None and err.connected and mode == "none":
        extra["note"] = ("the connection was lost after the batch was sent; it may have been "
                         "applied. Identity mode none never deduplicates: check the project "
                         "before resending from failed_batch_starts_at")
    message = (f"batch {totals['batches'] + 1} failed after {totals['submitted']} submitted "
               f"jobs: {err.line()}")
    return _fail(message, totals, err.envelope(), **extra)


# --- enqueue-source -------------------------------------------------------------------

def _source_body(path: str, progress: Progress):
    """A file, or stdin, as a request body: with a length when it is a
    regular file (no chunked upload), else streamed in chunks."""
    if path == "-":
        stream = getattr(sys.stdin, "buffer", sys.stdin)
    else:
        try:
            stream = open(path, "rb")
        except OSError as exc:
            raise CliError(f"enqueue-source: {path}: {exc.strerror}") from None
    info = os.fstat(stream.fileno())
    if stat.S_ISREG(info.st_mode):
        size = info.st_size - stream.seek(0, os.SEEK_CUR)
        return stream, UploadBody(stream, size, progress)
    return stream, iter(UploadBody(stream, 0, progress))


def cmd_enqueue_source(client, args):
    project, inputs = project_and_inputs(args, max_inputs=1)
    if not inputs:
        raise UsageError("enqueue-source: --input FILE (or '-') is required")
    progress = Progress(f"upload {project}", enabled=args.progress)
    stream, body = _source_body(inputs[0], progress)
    try:
        result = client.request("POST", f"admin/projects/{segment(project)}/source", data=body,
                                headers={"Content-Type": "application/zstd"})
    except ApiError as err:
        raise CliError(f"enqueue-source: {err.line()}") from None
    finally:
        progress.close()
        if stream is not getattr(sys.stdin, "buffer", sys.stdin):
            stream.close()
    # An older master leaves project_id out; any other mismatch is refused.
    result.setdefault("project_id", project)
    counts = [result.get(key) for key in ("jobs", "inserted", "uncompressed_bytes")]
    if result["project_id"] != project or not all(isinstance(n, int) and n >= 0 for n in counts) \
            or counts[1] > counts[0]:
        raise CliError("enqueue-source: server returned an invalid response "
                       f"{json.dumps(result, ensure_ascii=False)[:300]}")
    return _emit({"project_id": project, "jobs": counts[0], "inserted": counts[1],
                  "uncompressed_bytes": counts[2]})
