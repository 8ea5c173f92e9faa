"""Enqueue from the project page: pasted values, JSON Lines, and ``.zst``
source files (``jobs-jsonl-zstd-v1``, streamed through the source importer).

Pasted values and JSON Lines go in as one atomic batch of at most
``MAX_JOBS`` jobs, like one API call: an identity conflict changes nothing.
Larger lists belong in a ``.zst`` source file, which commits in batches and
reports how far it got.
"""
from __future__ import annotations


from flask import current_app, request
from flask_babel import gettext as _

from app.errors import InvalidJob, InvalidRequest, TooLarge
from app.pages.admin.base import attempt, bp
from app.projects import enqueue, service, source_import
from workers.wire.protocol import (JsonTooDeep, SpecError, default_job_id, normalize_jobspec,
                              strict_json_loads)
from workers.wire.source import Limits

MAX_JOBS = 10_000
# SavewebHQ's web enqueue: a JSON array of 1..256 JobSpecs, as its API batch.
MAX_ARRAY_JOBS = 256


def _result(result) -> str:
    existing = result.submitted - result.inserted
    if existing:
        return _("%(submitted)s jobs submitted: %(inserted)s new, %(existing)s already queued.",
                 submitted=result.submitted, inserted=result.inserted, existing=existing)
    return _("%(submitted)s jobs submitted: %(inserted)s new.", submitted=result.submitted,
             inserted=result.inserted)


def _normalize(raw, mode: str, where: str, **details) -> dict:
    """``where``: "line 3" of pasted text, "job 0" of an array."""
    try:
        return normalize_jobspec(raw, mode)
    except SpecError as exc:
        raise InvalidJob(f"{where}: {exc}", details={"field": exc.field, **details}) from None


def _loads(text: str, where: str = ""):
    prefix = f"{where}: " if where else ""
    try:
        return strict_json_loads(text)
    except JsonTooDeep as exc:
        raise InvalidJob(f"{prefix}refused: {exc}") from None
    except ValueError as exc:
        raise InvalidJob(f"{prefix}not valid JSON ({exc})") from None


def _lines(text: str) -> list[tuple[int, str]]:
    # Values are kept exactly as typed (as hqctl and the API keep them): only
    # lines that are blank after trimming are skipped.
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not numbered:
        raise InvalidRequest("nothing to enqueue: the list is empty")
    if len(numbered) > MAX_JOBS:
        raise TooLarge(f"at most {MAX_JOBS} jobs at once; use a .zst source file for more")
    return numbered


def specs_from_values(text: str, mode: str, job_type: str) -> list[dict]:
    """One job per non-empty line. ``external_id`` projects get the default
    id ``j1_…`` of DESIGN §4.2, so pasting the same value twice is idempotent."""
    specs = []
    for n, value in _lines(text):
        raw = {"value": value, "type": job_type}
        if mode == "external_id":
            raw["id"] = default_job_id(value, job_type)
        specs.append(_normalize(raw, mode, f"line {n}"))
    return specs


def specs_from_jsonl(text: str, mode: str) -> list[dict]:
    return [_normalize(_loads(line, f"line {n}"), mode, f"line {n}") for n, line in _lines(text)]


def specs_from_array(text: str, mode: str) -> list[dict]:
    """A JSON array of JobSpecs, as SavewebHQ's enqueue page takes it."""
    if not text.strip():
        raise InvalidRequest("nothing to enqueue: paste a JSON array of jobs")
    raw = _loads(text)
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_ARRAY_JOBS:
        raise InvalidJob(f"expected a JSON array of 1 to {MAX_ARRAY_JOBS} jobs")
    return [_normalize(item, mode, f"job {n}", index=n) for n, item in enumerate(raw)]


@bp.post("/projects/<segment:project_id>/enqueue/json")
def enqueue_json(project_id):
    def run():
        project = service.get(project_id)
        return enqueue.enqueue(project, specs_from_array(request.form.get("jobs", ""),
                                                         project.identity_mode))

    return attempt(run, _result, "admin.project", project_id=project_id)


@bp.post("/projects/<segment:project_id>/enqueue/values")
def enqueue_values(project_id):
    def run():
        project = service.get(project_id)
        job_type = request.form.get("type", "seed")
        specs = specs_from_values(request.form.get("values", ""), project.identity_mode, job_type)
        return enqueue.enqueue(project, specs)

    return attempt(run, _result, "admin.project", project_id=project_id)


def _jsonl_text() -> str:
    upload = request.files.get("jsonl_file")
    if upload is not None and upload.filename:
        limit = current_app.config["ENQUEUE_BODY_LIMIT"]
        data = upload.stream.read(limit + 1)
        if len(data) > limit:
            raise TooLarge(f"JSON Lines file exceeds {limit} bytes; use a .zst source file")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidJob("the file is not UTF-8 text") from None
    return request.form.get("jsonl", "")


@bp.post("/projects/<segment:project_id>/enqueue/jsonl")
def enqueue_jsonl(project_id):
    def run():
        project = service.get(project_id)
        return enqueue.enqueue(project, specs_from_jsonl(_jsonl_text(), project.identity_mode))

    return attempt(run, _result, "admin.project", project_id=project_id)


@bp.post("/projects/<segment:project_id>/enqueue/source")
def enqueue_source(project_id):
    cfg = current_app.config

    def run():
        upload = request.files.get("source")
        if upload is None or not upload.filename:
            raise InvalidRequest("choose a .zst source file to upload")
        limits = Limits(max_compressed=cfg["SOURCE_MAX_COMPRESSED"],
                        max_expanded=cfg["SOURCE_MAX_EXPANDED"], max_jobs=cfg["SOURCE_MAX_JOBS"],
                        max_line=cfg["SOURCE_MAX_LINE"], max_window=cfg["SOURCE_MAX_WINDOW"])
        return source_import.import_source(project_id, upload.stream, limits=limits,
                                           batch_size=cfg["SOURCE_BATCH"])

    return attempt(run, lambda r: _("Source imported: %(jobs)s jobs read, %(inserted)s new.",
                                    jobs=r.jobs, inserted=r.inserted),
                   "admin.project", project_id=project_id)
