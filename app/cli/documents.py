"""``flask fleet documents add FILE…``: put documents in from the master host."""
from __future__ import annotations

import os
import sys

import click

from app.cli.group import fail, fleet
from app.errors import FleetError


@fleet.group("documents")
def documents():
    """Documents of a documents project (put in, then OCRed and searchable)."""


@documents.command("add")
@click.option("--project", "project_id", required=True, help="A project of kind documents.")
@click.option("--languages", default=None,
              help="Tesseract languages for their OCR, joined by '+' (default eng).")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, readable=True))
def add(project_id, languages, files):
    """Put FILES (PDF, TIFF, PNG, JPEG) into PROJECT: one line each, a refused
    file says why and the rest still go in; exit status 1 if any was refused."""
    from flask import current_app

    from app.documents import intake, reading
    from app.storage import shared_store
    from app.uploads.spool import Spool

    cfg = current_app.config
    try:
        intake.documents_project(project_id)
    except FleetError as exc:
        fail(exc)
    store, spool = shared_store(cfg), Spool.from_config(cfg)
    refused = 0
    for path in files:
        scratch = intake.scratch_dir(spool.directory)
        try:
            sha256, _ = intake.sha256_file(path)
            added = intake.add_file(project_id, path, sha256, path, via="cli", by="cli",
                                    store=store, workdir=scratch.name,
                                    max_bytes=cfg["UPLOAD_MAX_BYTES"], languages=languages)
        except FleetError as exc:
            refused += 1
            name = os.path.basename(path)
            message = exc.message[len(name) + 2:] if exc.message.startswith(f"{name}: ") else exc.message
            click.echo(f"refused {path}: {message}", err=True)
            continue
        finally:
            intake.remove_scratch(scratch)
        doc = reading.get(added.document_id)
        click.echo(f"{'added' if added.created else 'already in'} {path}: document "
                   f"{doc['document_id']}, {doc['pages']} page(s), {doc['state']}")
    if refused:
        sys.exit(1)


@documents.command("ocr")
@click.option("--profile", "profile_name", required=True,
              help="The new run's profile name (a-z, 0-9, '-'): one run per document and profile.")
@click.option("--languages", default="eng", show_default=True, help="Tesseract languages joined by '+'.")
@click.option("--project", "project_id", default=None, help="Every document of this project.")
@click.argument("document_ids", nargs=-1, type=click.IntRange(1))
def ocr_again(profile_name, languages, project_id, document_ids):
    """OCR documents again with another profile: DOCUMENT_IDS, or every
    document of --project. Their text is indexed once the new run is done."""
    from app.documents import runs
    if bool(document_ids) == bool(project_id):
        raise click.UsageError("give document ids or --project, not both")
    try:
        result = runs.reocr({"name": profile_name, "languages": languages}, project_id=project_id,
                            document_ids=list(document_ids) or None, actor="cli")
    except FleetError as exc:
        fail(exc)
    click.echo(f"profile {profile_name} ({languages}): {len(result['queued'])} queued, "
               f"{len(result['already_queued'])} already queued, {len(result['skipped'])} skipped "
               "(already had a run of this profile)")


@documents.command("consume")
@click.option("--folder", default=None, help="The consume folder (default FLEETHQ_CONSUME_DIR, "
                                             "else <data dir>/consume).")
@click.option("--project", "project_id", default=None,
              help="The documents project of top-level files (default FLEETHQ_CONSUME_PROJECT).")
@click.option("--polling", "polling_s", default=None, type=click.IntRange(0, 3600),
              help="List the folder every N seconds instead of inotify (network mounts).")
@click.option("--once", is_flag=True, help="One pass over what is there now, then exit.")
def consume(folder, project_id, polling_s, once):
    """Watch the consume folder: each file that stopped growing becomes a
    document, then moves to done/ (or failed/ with its reason beside it)."""
    import signal
    import threading

    from flask import current_app

    from app.documents.consume import Folder, intake_adder
    from workers import logs
    logs.configure("consume", json=current_app.config.get("LOG_JSON"), level=current_app.config.get("LOG_LEVEL"))
    cfg = current_app.config
    root = folder or cfg.get("CONSUME_DIR") or os.path.join(cfg["DATA_DIR"], "consume")
    project = project_id or cfg.get("CONSUME_PROJECT")
    polling = cfg["CONSUME_POLLING_S"] if polling_s is None else polling_s
    watched = Folder(root, project, cfg["CONSUME_SETTLE_S"], intake_adder(cfg))
    if once:
        watched.settle_s = 0
        watched.settled(0.0)  # the first look only records what is there
        for outcome in watched.pass_once(0.0):
            click.echo(f"{outcome.state} {outcome.name}"
                       + (f": document {outcome.document_id}" if outcome.document_id else "")
                       + (f": {outcome.reason}" if outcome.reason and outcome.state != "done" else ""))
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"consume: watching {os.path.abspath(root)} "
               f"({f'every {polling} s' if polling else 'inotify'}); top-level files go to "
               f"{project or 'no project (set FLEETHQ_CONSUME_PROJECT)'}", err=True)
    watched.run(stop, polling_s=polling)


@fleet.command("reindex")
@click.option("--batch", default=100, show_default=True, type=click.IntRange(1, 1000),
              help="Papers and documents read and indexed per transaction.")
def reindex(batch):
    """Rebuild the text index from the archived PDFs: every OCRed or indexed
    paper and document, read again from the PDF its text came from. A line of
    progress per batch on standard error; exit status 1 if any PDF could not
    be read (each is named)."""
    from flask import current_app

    from app.search import reindex as rebuild
    from app.storage import shared_store

    def report(progress):
        click.echo(f"reindex: {progress.done + len(progress.failed)}/{progress.total} read, "
                   f"{progress.pages} pages indexed, {len(progress.failed)} failed", err=True)
    progress = rebuild.run(shared_store(current_app.config), batch=batch, report=report)
    for key, why in progress.failed:
        click.echo(f"not reindexed {key}: {why}", err=True)
    click.echo(f"reindexed {progress.done} of {progress.total} papers and documents, "
               f"{progress.pages} pages")
    if progress.failed:
        sys.exit(1)
