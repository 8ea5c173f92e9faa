"""``flask fleet documents add FILE…``: put documents in from the master host."""
from __future__ import annotations

import sys

import click

from app.cli import _fail, fleet
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
        _fail(exc)
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
            click.echo(f"refused {path}: {exc.message}", err=True)
            continue
        finally:
            intake.remove_scratch(scratch)
        doc = reading.get(added.document_id)
        click.echo(f"{'added' if added.created else 'already in'} {path}: document "
                   f"{doc['document_id']}, {doc['pages']} page(s), {doc['state']}")
    if refused:
        sys.exit(1)
