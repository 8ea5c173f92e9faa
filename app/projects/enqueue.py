"""Put jobs into a project: identity modes, idempotency and conflicts (DESIGN §4.3).

A batch is staged with ``COPY`` into a temporary table and inserted from
there with ``ON CONFLICT DO NOTHING``: far cheaper per row than parameter
arrays, and the same path serves API batches and streamed source imports.
Rows that already existed are compared field by field; any difference is an
``identity_conflict`` and the whole batch rolls back. A project without
identities (``none``) has nothing to compare: its batches are copied straight
into ``jobs``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from sqlalchemy import text

from app import audit
from app.errors import Conflict, InvalidJob
from app.extensions import changed, db
from app.projects import service, wakeups
from app.projects.models import Project
from app.sites import keys as site_keys
from workers.wire.canonical import InvalidIdentifier, canonical_key
from workers.wire.protocol import compact_json, value_digest

_STAGE_DDL = """
CREATE TEMP TABLE IF NOT EXISTS job_stage (
    seq int, ext_id text, value_sha256 bytea, value text, type text, via text,
    hops int, attr jsonb, random_key int, site_key text
) ON COMMIT DELETE ROWS
"""

# identity_mode none is not staged: insert_batch copies it straight into jobs.
_CONFLICT_TARGET = {
    "external_id": ("ext_id", "ON CONFLICT (project_id, ext_id) WHERE ext_id IS NOT NULL DO NOTHING"),
    "unique_value": ("value_sha256",
                     "ON CONFLICT (project_id, value_sha256) WHERE value_sha256 IS NOT NULL DO NOTHING"),
}

# No task deadline yet: it starts at the job's first claim (DESIGN §5), so a
# backlog of any size waits in the queue without expiring.
_INSERT = """
INSERT INTO jobs (project_id, ext_id, value_sha256, value, type, via, hops, attr, random_key, site_key)
SELECT :p, ext_id, value_sha256, value, type, via, hops, attr,
       COALESCE(random_key, floor(random() * 4294967296 - 2147483648)::int), site_key
FROM job_stage ORDER BY seq
{on_conflict}
"""

_FIRST_CONFLICT = """
SELECT s.seq, j.id FROM job_stage s JOIN jobs j ON j.project_id = :p AND j.{key} = s.{key}
WHERE (j.value, j.type, j.via, j.hops, j.attr) IS DISTINCT FROM (s.value, s.type, s.via, s.hops, s.attr)
ORDER BY s.seq LIMIT 1
"""


@dataclass
class EnqueueResult:
    submitted: int
    inserted: int


def _identity(spec: dict, mode: str):
    if mode == "external_id":
        return spec["id"]
    if mode == "unique_value":
        return spec["value"]
    return None


def _json_equal(a, b) -> bool:
    """Equality as jsonb sees it: true is not 1, while 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _same_job(a: dict, b: dict) -> bool:
    return all(_json_equal(a.get(k), b.get(k)) for k in ("value", "type", "via", "hops", "attr"))


def collapse_duplicates(specs: list[dict], mode: str, offset: int = 0) -> list[tuple[int, dict]]:
    """Drop identical in-batch duplicates; a differing duplicate is a conflict.

    ``random_key`` is not job data, but a batch may not name two keys for one
    job (A5): copies that name different keys are a conflict, and a key named
    by any copy is the job's key.

    Returns (index, spec) pairs of the first occurrence of each identity.
    """
    if mode == "none":
        return list(enumerate(specs, offset))
    position: dict = {}  # identity -> its place in ``kept``
    kept: list[tuple[int, dict]] = []
    for index, spec in enumerate(specs, offset):
        key = _identity(spec, mode)
        place = position.get(key)
        if place is None:
            position[key] = len(kept)
            kept.append((index, spec))
            continue
        first_index, first = kept[place]
        if not _same_job(first, spec):
            raise Conflict("two jobs in this batch share an identity but differ",
                           code="identity_conflict",
                           details={"index": index, "first_index": first_index, "id": spec.get("id")})
        named = spec.get("random_key")
        if named is None:
            continue
        if first.get("random_key") is None:
            kept[place] = (first_index, {**first, "random_key": named})
        elif first["random_key"] != named:
            raise Conflict("two copies of one job in this batch name different random keys",
                           code="identity_conflict",
                           details={"index": index, "first_index": first_index,
                                    "id": spec.get("id"), "field": "random_key"})
    return kept


def _check_paper_identifiers(specs: list[dict], offset: int) -> None:
    """pdf jobs must name a paper: a DOI, an arXiv id or an http(s) URL."""
    for index, spec in enumerate(specs, offset):
        try:
            canonical_key(spec["value"])
        except InvalidIdentifier as exc:
            raise InvalidJob(f"jobs[{index}]: {exc}",
                             details={"index": index, "field": "value"}) from None


def _site_key(spec: dict, index: int) -> str | None:
    try:
        return site_keys.for_value(spec["value"], spec.get("attr"))
    except site_keys.InvalidSiteKey as exc:
        raise InvalidJob(f"jobs[{index}]: attr.{site_keys.NAMED_ATTR}: {exc}",
                         details={"index": index, "field": "attr"}) from None


# What _job_fields gives, in its order.
_JOB_COLUMNS = "value, type, via, hops, attr, site_key"


def _job_fields(spec: dict, index: int, document_runs: bool) -> tuple:
    attr = spec.get("attr")
    return (spec["value"], spec["type"], spec.get("via"), spec.get("hops"),
            compact_json(attr) if attr is not None else None,
            None if document_runs else _site_key(spec, index))


def _random_key(spec: dict) -> int:
    """The job's own key, or one drawn uniformly from the signed 32-bit range
    (as ``_INSERT`` draws it for a staged row)."""
    named = spec.get("random_key")
    return random.getrandbits(32) - 2**31 if named is None else named


def _copy_rows(raw, copy_sql: str, rows) -> None:
    with raw.cursor() as cur:
        with cur.copy(copy_sql) as copy:
            for row in rows:
                copy.write_row(row)


def insert_batch(project: Project | service.ProjectView, specs: list[dict], *, offset: int = 0,
                 document_runs: bool = False) -> EnqueueResult:
    """Insert normalized specs in the open transaction; the caller commits.
    ``document_runs``: the OCR runs app.documents makes, the only jobs a
    documents project takes (they reach no site). Every other job gets its
    site key here (app.sites.keys).

    Raises:
        Conflict: ``identity_conflict``; the caller must roll back.
        InvalidJob: a job a project of this kind cannot take.
    """
    mode = project.identity_mode
    if project.kind == "pdf":
        _check_paper_identifiers(specs, offset)
    elif project.kind == "documents" and not document_runs and specs:
        raise InvalidJob(f"{project.id} is a documents project: it takes files, not jobs "
                         f"(POST /api/v1/fleethq/projects/{project.id}/documents, or "
                         "flask --app wsgi fleet documents add)",
                         details={"index": offset, "field": "value"})
    kept = collapse_duplicates(specs, mode, offset)
    if not kept:
        return EnqueueResult(len(specs), 0)
    conn = db.session.connection()
    raw = conn.connection.driver_connection
    assert raw is not None  # a checked-out connection always has its driver's
    project_id = project.id   # read once: an ORM attribute costs per row
    if mode == "none":
        # Nothing to compare: the rows are copied straight into jobs, in the
        # batch's order. The staging pass cost PostgreSQL about 1.5 ms of 14
        # per 1,000 jobs (bench/vs_savewebhq.py's enqueue, hqctl's plain values).
        _copy_rows(raw, f"COPY jobs (project_id, random_key, {_JOB_COLUMNS}) FROM STDIN",
                   ((project_id, _random_key(spec), *_job_fields(spec, index, document_runs))
                    for index, spec in kept))
        return EnqueueResult(len(specs), len(kept))
    conn.exec_driver_sql(_STAGE_DDL)
    _copy_rows(raw, f"COPY job_stage (seq, ext_id, value_sha256, random_key, {_JOB_COLUMNS}) FROM STDIN",
               ((index, spec.get("id"), value_digest(spec["value"]) if mode == "unique_value" else None,
                 spec.get("random_key"), *_job_fields(spec, index, document_runs))
                for index, spec in kept))
    key, on_conflict = _CONFLICT_TARGET[mode]
    inserted = changed(text(_INSERT.format(on_conflict=on_conflict)), {"p": project_id})
    if inserted < len(kept):
        clash = db.session.execute(text(_FIRST_CONFLICT.format(key=key)), {"p": project_id}).first()
        if clash is not None:
            raise Conflict("a job with this identity exists with different fields",
                           code="identity_conflict",
                           details={"index": clash[0], "job_id": clash[1],
                                    "id": specs[clash[0] - offset].get("id")})
    return EnqueueResult(len(specs), inserted)


def enqueue(project: Project | service.ProjectView, specs: list[dict]) -> EnqueueResult:
    """Enqueue one batch atomically into ``project``, as the caller read it in
    this session (the ORM object or its plain view: it needed the identity
    mode to check the specs). Commits; a conflict changes nothing."""
    service.ensure_status(project, "active", "draining")
    try:
        result = insert_batch(project, specs)
        if result.inserted:
            wakeups.notify(project.id)
        audit.tally("jobs.enqueue", "project", project.id,
                    {"submitted": result.submitted, "inserted": result.inserted})
        db.session.commit()
    except Exception:
        db.session.rollback()
        raise
    return result

