"""Documents in (issue "Documents in, documents out"): files people put into a
documents project through the API and ``flask fleet documents add`` are
checked, converted without loss when they are images, archived, registered,
and queued for OCR through the derived-job path; broken files are refused by
name and reason, charge nothing and lose nothing else."""
from __future__ import annotations

import hashlib
import os
from urllib.parse import quote

import pikepdf
import pytest

from tests import pdfs, scans
from tests.helpers import Api, api_error, body, sql
from tests.support.documents import api  # noqa: F401 (fixture: a documents project docs)

WORDS = [["quartz harbour lantern", "meadow thunder violin"], ["copper falcon whisper"]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("documents")
    made = {
        "scan.pdf": scans.scanned_pdf(d / "scan.pdf", WORDS),
        "bilevel.tif": scans.image_file(d / "bilevel.tif", WORDS[:1], "TIFF", mode="1"),
        "multi.tif": scans.image_file(d / "multi.tif", WORDS, "TIFF", mode="1"),
        "grey.tif": scans.image_file(d / "grey.tif", WORDS[:1], "TIFF"),
        "four-bit.tif": scans.image_file(d / "four-bit.tif", WORDS[:1], "TIFF", mode="P4"),
        "no-dpi.png": scans.image_file(d / "no-dpi.png", WORDS[:1], "PNG", dpi=None),
        "colour.png": scans.image_file(d / "colour.png", WORDS[:1], "PNG", mode="RGB"),
        "photo.jpg": scans.image_file(d / "photo.jpg", WORDS[:1], "JPEG", quality=90),
        "rotated.tif": scans.image_file(d / "rotated.tif", [["rotated page words"]], "TIFF"),
    }
    out = {name: path.read_bytes() for name, path in made.items()}
    out["empty.pdf"] = b""
    out["truncated.pdf"] = out["scan.pdf"][: len(out["scan.pdf"]) // 2]
    out["notes.pdf"] = b"these are my notes, not a PDF\n" * 20
    out["cut.jpg"] = out["photo.jpg"][: len(out["photo.jpg"]) // 2]
    out["garbage.tif"] = b"II*\x00" + os.urandom(2000)
    pdfs.spinning_pdf(d / "bomb.pdf")  # 4 GiB of page content in a few KiB
    out["bomb.pdf"] = (d / "bomb.pdf").read_bytes()
    return out


def _add(api, name, data, project="docs", **query):
    params = "&".join(f"{k}={quote(str(v))}" for k, v in {"filename": name, **query}.items())
    return api.call("POST", f"/api/v1/fleethq/projects/{project}/documents?{params}", data=data,
                    content_type="application/octet-stream")


PAGES = {"scan.pdf": 2, "bilevel.tif": 1, "multi.tif": 2, "grey.tif": 1, "four-bit.tif": 1,
         "no-dpi.png": 1, "colour.png": 1, "photo.jpg": 1, "rotated.tif": 1}
MEDIA = {"pdf": "application/pdf", "tif": "image/tiff", "png": "image/png", "jpg": "image/jpeg"}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_scan_format_is_archived_and_queued_for_ocr(app, api, dirs, files, name):  # noqa: F811
    data = files[name]
    response = _add(api, name, data)
    assert response.status_code == 201, body(response)
    doc = body(response)
    sha = hashlib.sha256(data).hexdigest()
    assert (doc["filename"], doc["sha256"], doc["size"], doc["pages"]) == (name, sha, len(data), PAGES[name])
    assert doc["media_type"] == MEDIA[name.rsplit(".", 1)[1]]
    assert (doc["state"], doc["searchable"], doc["asset_key"]) == ("queued", False, f"doc:{sha}")
    # The archived PDF is in the store under its content key and has the pages.
    (asset,) = sql(app, "SELECT sha256, size, object_key, pages FROM assets WHERE canonical_key = :k",
                   k=f"doc:{sha}")
    stored = dirs.objects / asset[2]
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == asset[0] and asset[3] == PAGES[name]
    with pikepdf.open(stored) as pdf:
        assert len(pdf.pages) == PAGES[name]
    if not name.endswith(".pdf"):  # the file as it came is kept too, byte for byte
        (original,) = sql(app, "SELECT original_key FROM documents WHERE id = :d", d=doc["document_id"])
        assert (dirs.objects / original[0]).read_bytes() == data
    # One OCR run, a derived job of the document in the same project.
    (job,) = sql(app, "SELECT j.id, j.state, j.value, dj.source_key, dj.source_pages, dj.languages "
                      "FROM jobs j JOIN derived_jobs dj ON dj.job_id = j.id WHERE j.project_id = 'docs'")
    assert tuple(job[1:]) == ("todo", f"doc:{sha}", f"doc:{sha}", PAGES[name], "eng")
    assert doc["ocr"]["job_id"] == job[0]


def test_a_lossless_conversion_keeps_the_pixels(app, api, dirs, files):  # noqa: F811
    doc = body(_add(api, "bilevel.tif", files["bilevel.tif"]))
    (key,) = sql(app, "SELECT object_key FROM assets WHERE canonical_key = :k", k=doc["asset_key"])[0]
    with pikepdf.open(dirs.objects / key) as pdf:
        (image,) = pdf.pages[0].get_images().values()
        # The fax-coded data is embedded as it was, not decoded and re-encoded.
        assert pikepdf.Name.CCITTFaxDecode in list(pikepdf.Array([image.Filter]).as_list()[0] if
                                                   isinstance(image.Filter, pikepdf.Array) else [image.Filter])


def test_the_same_file_twice_is_one_document(app, api, files):
    first = _add(api, "scan.pdf", files["scan.pdf"])
    again = _add(api, "copy of scan.pdf", files["scan.pdf"])
    assert (first.status_code, again.status_code) == (201, 200)
    assert body(again)["document_id"] == body(first)["document_id"]
    assert body(again)["filename"] == "scan.pdf"  # the first name stays
    assert sql(app, "SELECT count(*) FROM jobs WHERE project_id = 'docs'")[0][0] == 1


BROKEN = {"empty.pdf": "empty", "truncated.pdf": "no_eof", "notes.pdf": "unsupported_format",
          "cut.jpg": "unreadable_image", "garbage.tif": "unreadable_image", "bomb.pdf": "too_inflated"}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_file_is_refused_by_name_and_reason_and_charges_nothing(app, api, dirs, files, name):  # noqa: F811
    assert _add(api, "scan.pdf", files["scan.pdf"]).status_code == 201
    error = api_error(_add(api, name, files[name]), 422, "invalid_document")
    assert error["details"] == {"file": name, "reason": BROKEN[name]}
    assert error["message"].startswith(f"{name}: ")
    assert str(dirs.spool) not in error["message"]
    # Nothing of it is registered, queued or left behind; the good one stays.
    assert sql(app, "SELECT filename FROM documents") == [("scan.pdf",)]
    assert sql(app, "SELECT count(*) FROM jobs")[0][0] == 1
    assert not list((dirs.spool / "intake").iterdir())


def test_documents_go_only_into_documents_projects(app, api, files):
    api.put_project("papers", kind="pdf", identity_mode="unique_value")
    error = api_error(_add(api, "scan.pdf", files["scan.pdf"], project="papers"), 400, "invalid_request")
    assert "documents" in error["message"]
    api_error(_add(api, "scan.pdf", files["scan.pdf"], project="nowhere"), 404, "not_found")
    # ... and a documents project takes no hand-made jobs.
    error = api_error(api.enqueue("docs", [{"id": "a", "value": "https://example.org/a.pdf"}]), 400, "invalid_job")
    assert "/api/v1/fleethq/projects/docs/documents" in error["message"]


def test_an_upload_needs_a_length_and_respects_the_size_limit(app, api, files):
    app.config["UPLOAD_MAX_BYTES"], saved = 1000, app.config["UPLOAD_MAX_BYTES"]
    try:
        error = api_error(_add(api, "scan.pdf", files["scan.pdf"]), 413, "too_large")
        assert error["details"]["limit"] == 1000
    finally:
        app.config["UPLOAD_MAX_BYTES"] = saved
    assert sql(app, "SELECT count(*) FROM documents")[0][0] == 0


def test_languages_choose_the_ocr_run_and_bad_ones_are_refused(app, api, files):
    api_error(_add(api, "scan.pdf", files["scan.pdf"], languages="eng; rm"), 400, "invalid_request")
    doc = body(_add(api, "scan.pdf", files["scan.pdf"], languages="eng+pol"))
    assert doc["ocr"]["languages"] == "eng+pol"


def test_readers_read_documents_and_only_admins_put_them_in(app, client, api, make_user, files):
    doc = body(_add(api, "scan.pdf", files["scan.pdf"]))
    reader = Api(client, make_user("rita", ["reader"]))
    shown = reader.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}")
    assert shown.status_code == 200 and body(shown)["filename"] == "scan.pdf"
    listed = body(reader.call("GET", "/api/v1/fleethq/projects/docs/documents"))
    assert [d["document_id"] for d in listed["documents"]] == [doc["document_id"]]
    assert listed["next_after_id"] is None
    api_error(_add(reader, "scan.pdf", files["scan.pdf"]), 403, "permission_denied")
    worker = Api(client, make_user("wanda", ["worker"]))
    api_error(worker.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}"), 403,
              "permission_denied")
    api_error(reader.call("GET", "/api/v1/fleethq/documents/999999"), 404, "not_found")


def test_the_list_pages_with_a_cursor(app, api, files):
    for name in ("scan.pdf", "grey.tif", "photo.jpg"):
        assert _add(api, name, files[name]).status_code == 201
    first = body(api.call("GET", "/api/v1/fleethq/projects/docs/documents?limit=2"))
    assert [d["filename"] for d in first["documents"]] == ["scan.pdf", "grey.tif"]
    rest = body(api.call("GET", f"/api/v1/fleethq/projects/docs/documents?after_id={first['next_after_id']}"))
    assert [d["filename"] for d in rest["documents"]] == ["photo.jpg"] and rest["next_after_id"] is None


def test_the_command_adds_files_and_names_each_refusal(app, api, files, tmp_path):
    paths = []
    for name in ("multi.tif", "notes.pdf", "photo.jpg"):
        (tmp_path / name).write_bytes(files[name])
        paths.append(str(tmp_path / name))
    result = app.test_cli_runner().invoke(
        args=["fleet", "documents", "add", "--project", "docs", *paths])
    assert result.exit_code == 1, result.output
    assert "added" in result.stdout and "multi.tif" in result.stdout and "photo.jpg" in result.stdout
    assert f"refused {paths[1]}: not a PDF, TIFF, PNG or JPEG" in result.stderr
    assert sorted(r[0] for r in sql(app, "SELECT filename FROM documents")) == ["multi.tif", "photo.jpg"]
    assert {r[0] for r in sql(app, "SELECT added_via FROM documents")} == {"cli"}
    again = app.test_cli_runner().invoke(
        args=["fleet", "documents", "add", "--project", "docs", paths[0]])
    assert again.exit_code == 0 and again.stdout.startswith("already in")
    assert sql(app, "SELECT count(*) FROM audit_log WHERE action = 'documents.add'")[0][0] == 2


def test_readers_search_read_the_text_and_download_over_the_api(app, client, api, make_user, files):
    from app.extensions import db
    from app.search.index import index_paper
    doc = body(_add(api, "multi.tif", files["multi.tif"]))
    reader = Api(client, make_user("rita", ["reader"]))
    empty = body(reader.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}/pages"))
    assert (empty["pages"], empty["text"]) == (2, [])  # not OCRed yet
    with app.app_context():  # what the archive commit of its OCR run writes
        index_paper(doc["asset_key"], "docs", "quartz harbour\fcopper falcon whisper\f")
        db.session.commit()
        db.session.remove()
    found = body(reader.call("GET", "/api/v1/fleethq/documents/search?q=falcon"))
    (hit,) = found["results"]
    assert (hit["document_id"], hit["filename"], hit["page"]) == (doc["document_id"], "multi.tif", 2)
    text = body(reader.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}/pages?first=2&q=falcon"))
    assert text["text"] == [{"page": 2, "segments": [
        {"text": "copper ", "match": False}, {"text": "falcon", "match": True},
        {"text": " whisper", "match": False}]}]
    original = reader.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}/file/original")
    assert original.status_code == 200 and original.data == files["multi.tif"]
    assert original.headers["Content-Disposition"].endswith("filename*=UTF-8''multi.tif")
    as_pdf = reader.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}/file/pdf")
    assert as_pdf.data.startswith(b"%PDF") and "multi.pdf" in as_pdf.headers["Content-Disposition"]
    error = api_error(reader.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}/file/ocr"),
                      404, "not_found")
    assert error["details"] == {"document_id": doc["document_id"], "file": "ocr"}
