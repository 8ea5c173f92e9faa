"""Stream a ``jobs-jsonl-zstd-v1`` body into a project, committing in batches."""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

from app import audit
from app.errors import Conflict, InvalidJob
from app.extensions import db
from app.projects import enqueue, service, wakeups
from workers.wire.source import Limits, SourceError, SourceReader


@dataclass
class ImportResult:
    jobs: int
    inserted: int
    uncompressed_bytes: int


def import_source(project_id: str, stream: BinaryIO, *, limits: Limits, batch_size: int) -> ImportResult:
    """Read, validate and insert; each batch commits on its own.

    Raises:
        InvalidJob: the body breaks the format or a limit (as the contract
            has it, any source that cannot be read is an invalid job), or
        Conflict: both with ``details.committed`` — the number of jobs
            already committed — and the failing line when known.
    """
    project = service.get(project_id)
    service.ensure_status(project, "active", "draining")
    reader = SourceReader(stream, project.identity_mode, limits)
    committed = inserted = 0
    batch: list[dict] = []

    def flush():
        nonlocal committed, inserted
        if not batch:
            return
        result = enqueue.insert_batch(project, batch, offset=committed)
        if result.inserted:
            wakeups.notify(project_id)
        # Each committed batch adds to the import's one row, so the log
        # matches what landed.
        audit.tally("jobs.import", "project", project_id,
                    {"submitted": len(batch), "inserted": result.inserted})
        db.session.commit()
        committed += len(batch)
        inserted += result.inserted
        batch.clear()

    try:
        for spec in reader:
            batch.append(spec)
            if len(batch) >= batch_size:
                flush()
        flush()
    except SourceError as exc:
        db.session.rollback()
        raise InvalidJob(str(exc), details={"committed": committed, "line": exc.line,
                                            "field": exc.field}) from None
    except Conflict as exc:
        db.session.rollback()
        exc.details = {**exc.details, "committed": committed,
                       "line": exc.details.get("index", 0) + 1}
        raise
    return ImportResult(reader.jobs, inserted, reader.uncompressed_bytes)
