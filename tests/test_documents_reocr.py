"""Re-OCR: a document (or every document of a project) OCRed again with a
chosen profile, over the API, the CLI and the document page; one run per
document and profile; the indexed run stays the marked one until the new
run's text is indexed, then the new one is; audited."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from tests import scans
from tests.helpers import api_error, body, sql
from tests.support.documents import api  # noqa: F401 (fixture: a documents project docs)
from tests.support.pages import Pages, sign_in


def _add(api, tmp_path, name, words):
    data = scans.scanned_pdf(tmp_path / name, [words]).read_bytes()
    response = api.call("POST", f"/api/v1/fleethq/projects/docs/documents?filename={quote(name)}",
                        data=data, content_type="application/octet-stream")
    assert response.status_code == 201, body(response)
    return body(response)


def _runs(app, document_id):
    return [tuple(r) for r in sql(app, """
        SELECT dj.profile, dj.languages, j.state, d.job_id = dj.job_id FROM documents d
        JOIN derived_jobs dj ON dj.target_project_id = d.project_id AND dj.source_key = d.asset_key
        JOIN jobs j ON j.id = dj.job_id WHERE d.id = :d ORDER BY dj.id""", d=document_id)]


def test_one_document_is_ocred_again_and_its_indexed_run_moves_only_when_done(app, api, tmp_path):
    doc = _add(api, tmp_path, "letter.pdf", ["harbour lantern"])
    sql(app, "UPDATE jobs SET state = 'done'")  # its first run finished
    answer = api.call("POST", "/api/v1/fleethq/projects/docs/documents/ocr", {
        "profile": {"name": "ocr-pol", "languages": "eng+pol"}, "document_ids": [doc["document_id"]]})
    assert answer.status_code == 200, body(answer)
    assert body(answer)["queued"] == [doc["document_id"]]
    assert _runs(app, doc["document_id"]) == [("ocr", "eng", "done", True),
                                              ("ocr-pol", "eng+pol", "todo", False)]
    # Asked again while it waits: the same run.
    again = body(api.call("POST", "/api/v1/fleethq/projects/docs/documents/ocr", {
        "profile": {"name": "ocr-pol", "languages": "eng+pol"}, "document_ids": [doc["document_id"]]}))
    assert (again["queued"], again["already_queued"]) == ([], [doc["document_id"]])
    # The new run's text is indexed by the archive commit: it becomes the indexed run.
    (job_id,) = sql(app, "SELECT job_id FROM derived_jobs WHERE profile = 'ocr-pol'")[0]
    from app.documents import runs
    from app.extensions import db
    with app.app_context():
        runs.indexed(job_id, doc["asset_key"], "docs")
        db.session.commit()
        db.session.remove()
    sql(app, "UPDATE jobs SET state = 'done' WHERE id = :j", j=job_id)
    assert _runs(app, doc["document_id"]) == [("ocr", "eng", "done", False),
                                              ("ocr-pol", "eng+pol", "done", True)]
    # A finished profile is not run again under the same name.
    error = api_error(api.call("POST", "/api/v1/fleethq/projects/docs/documents/ocr", {
        "profile": {"name": "ocr-pol"}, "document_ids": [doc["document_id"]]}), 409, "invalid_transition")
    assert "another profile" in error["message"]
    (audit,) = sql(app, "SELECT details FROM audit_log WHERE action = 'documents.reocr' "
                        "AND details ->> 'queued' = '1'")
    assert audit[0]["profile"] == {"name": "ocr-pol", "languages": "eng+pol"}


def test_every_document_of_a_project_with_the_command(app, api, tmp_path):
    docs = [_add(api, tmp_path, f"d{n}.pdf", [f"word{n} falcon"]) for n in range(3)]
    result = app.test_cli_runner().invoke(args=["fleet", "documents", "ocr", "--profile", "deskewed",
                                                "--languages", "eng", "--project", "docs"])
    assert result.exit_code == 0, result.output
    assert "3 queued, 0 already queued, 0 skipped" in result.output
    for doc in docs:
        assert [r[0] for r in _runs(app, doc["document_id"])] == ["ocr", "deskewed"]
    bad = app.test_cli_runner().invoke(args=["fleet", "documents", "ocr", "--profile", "Bad Name",
                                             "--project", "docs"])
    assert bad.exit_code == 1 and "profile.name" in bad.output


def test_bad_requests_are_refused_in_the_envelope(app, api, tmp_path):
    doc = _add(api, tmp_path, "letter.pdf", ["harbour lantern"])
    url = "/api/v1/fleethq/projects/docs/documents/ocr"
    api_error(api.call("POST", url, {"profile": {"name": "x y"}}), 400, "invalid_request")
    api_error(api.call("POST", url, {"profile": {"name": "p2"}, "document_ids": [999]}), 404, "not_found")
    api.put_project("other", kind="documents")
    api_error(api.call("POST", "/api/v1/fleethq/projects/other/documents/ocr",
                       {"profile": {"name": "p2"}, "document_ids": [doc["document_id"]]}), 404, "not_found")
    assert [r[0] for r in _runs(app, doc["document_id"])] == ["ocr"]


def test_an_admin_queues_a_run_on_the_document_page(app, client, api, tmp_path):
    doc = _add(api, tmp_path, "letter.pdf", ["harbour lantern"])
    sign_in(app, client)
    pages = Pages(client, "page-admin")
    shown = pages.text(f"/documents/{doc['document_id']}")
    assert 'id="reocr-form"' in shown
    message, _ = pages.act(f"/admin/documents/{doc['document_id']}/ocr",
                           {"profile": "ocr-pol", "languages": "eng+pol"})
    assert message == "OCR run ocr-pol queued; its text replaces the indexed text when it is done."
    page = pages.text(f"/documents/{doc['document_id']}")
    assert "ocr-pol" in page and "eng+pol" in page
    sign_in(app, client, "rita", roles=("reader",))
    assert 'id="reocr-form"' not in client.get(f"/documents/{doc['document_id']}").get_data(as_text=True)
    assert client.post(f"/admin/documents/{doc['document_id']}/ocr").status_code in (400, 403)


def test_profile_options_reach_ocrmypdfs_command_line():
    from pathlib import Path

    from workers.ocr import OcrLimits, OcrOptions, ocrmypdf_argv
    limits = OcrLimits(deskew=False, rotate_pages=True)
    plain = ocrmypdf_argv(Path("in.pdf"), Path("out.pdf"), ("eng",), limits)
    assert "--skip-text" in plain and "--rotate-pages" in plain and "--deskew" not in plain
    forced = ocrmypdf_argv(Path("in.pdf"), Path("out.pdf"), ("eng",), limits, options=OcrOptions.from_job(
        {"mode": "force", "deskew": True, "rotate": False, "clean": True, "optimize": 0}))
    assert "--force-ocr" in forced and "--skip-text" not in forced
    assert "--deskew" in forced and "--rotate-pages" not in forced and "--clean" in forced
    assert forced[forced.index("--optimize") + 1] == "0"
    redo = ocrmypdf_argv(Path("in.pdf"), Path("out.pdf"), ("eng",), limits,
                         options=OcrOptions.from_job({"mode": "redo", "mode2": "x"}))
    assert "--redo-ocr" in redo
    # What a master sends that this worker does not know is the worker's default.
    assert OcrOptions.from_job({"mode": "bogus", "optimize": 3}) == OcrOptions()


@pytest.mark.parametrize("profile, field", [
    ({"name": "p", "mode": "sideways"}, "profile.mode"),
    ({"name": "p", "deskew": "yes"}, "profile.deskew"),
    ({"name": "p", "optimize": 2}, "profile.optimize"),
    ({"name": "p", "mode": "redo", "deskew": True}, "profile.mode"),
    ({"name": "p", "colour": True}, "profile"),
])
def test_bad_profile_options_are_refused_by_field(app, api, tmp_path, profile, field):
    doc = _add(api, tmp_path, "letter.pdf", ["harbour lantern"])
    error = api_error(api.call("POST", "/api/v1/fleethq/projects/docs/documents/ocr", {
        "profile": profile, "document_ids": [doc["document_id"]]}), 400, "invalid_request")
    assert error["details"].get("field", "").startswith(field.split(".")[0]), error
