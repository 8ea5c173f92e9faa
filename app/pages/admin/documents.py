"""Adding documents on a documents project's page: several files at once
(chosen, or dropped on the file field), each through the intake of
app/documents; one refused file is named with its reason and the others
still go in."""
from __future__ import annotations

from flask import current_app, request
from flask_babel import gettext as _

from app.documents import intake
from app.errors import FleetError, InvalidRequest
from app.extensions import db
from app.pages.admin.base import actor, bp, done, refuse
from app.storage import shared_store
from app.uploads.spool import Spool

MAX_FILES = 100


@bp.post("/projects/<segment:project_id>/documents")
def add_documents(project_id):
    cfg = current_app.config
    uploads = [f for f in request.files.getlist("files") if f and f.filename]
    try:
        if not uploads:
            raise InvalidRequest(_("choose one or more files to add"))
        if len(uploads) > MAX_FILES:
            raise InvalidRequest(_("at most %(num)s files at once", num=MAX_FILES))
        intake.documents_project(project_id)
    except FleetError as exc:
        db.session.rollback()
        return refuse(exc.message, "admin.project", project_id=project_id)
    store, spool = shared_store(cfg), Spool.from_config(cfg)
    added, already, refused = 0, 0, []
    for upload in uploads:
        try:
            result = intake.add_stream(project_id, upload.stream, upload.filename, via="page",
                                       by=actor(), store=store, spool_directory=spool.directory,
                                       max_bytes=cfg["UPLOAD_MAX_BYTES"],
                                       languages=request.form.get("languages") or None)
        except FleetError as exc:
            db.session.rollback()
            refused.append(exc.message)
            continue
        added, already = added + result.created, already + (not result.created)
    summary = _("%(added)s added, %(already)s already in the project.", added=added, already=already)
    if refused:
        return refuse(summary + " " + _("Refused: %(files)s", files="; ".join(refused)),
                      "admin.project", project_id=project_id)
    return done(summary + " " + _("Their OCR is queued."), "admin.project", project_id=project_id)


@bp.post("/documents/<int:document_id>/ocr")
def reocr_document(document_id):
    from app.documents import runs
    profile = {"name": request.form.get("profile", "").strip(),
               "languages": request.form.get("languages", "").strip() or "eng"}
    if request.form.get("mode", "skip-text") != "skip-text":
        profile["mode"] = request.form["mode"]
    if request.form.get("deskew") == "yes":
        profile["deskew"] = True
    try:
        result = runs.reocr(profile, document_ids=[document_id], actor=actor())
    except FleetError as exc:
        db.session.rollback()
        return refuse(exc.message, "documents_pages.show", document_id=document_id)
    message = (_("OCR run %(profile)s queued; its text replaces the indexed text when it is done.",
                 profile=profile["name"]) if result["queued"] else
               _("OCR run %(profile)s is already queued.", profile=profile["name"]))
    return done(message, "documents_pages.show", document_id=document_id)
