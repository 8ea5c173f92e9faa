"""Documents on the pages: an admin adds several files on a documents
project's page; a reader (and only reader and up) lists them, searches their
text, opens a hit at its page with the words marked, and downloads the files
under their own names. The OCR output is written as the archive commit
would (app.search.index), so these tests need no OCR worker; the worker path
is tests/test_documents_ocr.py."""
from __future__ import annotations

import io
import re

import pytest

from tests import scans
from tests.helpers import Api, sql
from tests.support.documents import _ocr_done
from tests.support.pages import Pages, sign_in

WORDS = [["quartz harbour lantern"], ["copper falcon whisper"]]


@pytest.fixture
def files(tmp_path):
    return {"letter.tif": scans.image_file(tmp_path / "letter.tif", WORDS, "TIFF", mode="1").read_bytes(),
            "scan.pdf": scans.scanned_pdf(tmp_path / "scan.pdf", WORDS[:1]).read_bytes(),
            "notes.pdf": b"not a pdf at all\n" * 10}


@pytest.fixture
def admin_pages(app, client, admin_token, dirs):  # noqa: F811
    Api(client, admin_token).put_project("letters", kind="documents")
    sign_in(app, client)
    return Pages(client, "page-admin")


def _add_on_page(admin_pages, names, files):
    data = {"files": [(io.BytesIO(files[n]), n) for n in names]}
    return admin_pages.act("/admin/projects/letters/documents", data,
                           expect="error" if "notes.pdf" in names else "success",
                           content_type="multipart/form-data")


def test_an_admin_adds_several_files_on_the_project_page(app, admin_pages, files):
    page = admin_pages.text("/admin/projects/letters")
    assert 'id="documents-form"' in page and 'id="enqueue-values"' not in page
    message, _ = _add_on_page(admin_pages, ["letter.tif", "notes.pdf", "scan.pdf"], files)
    assert message.startswith("2 added, 0 already in the project.")
    assert "notes.pdf: not a PDF, TIFF, PNG or JPEG" in message
    rows = sql(app, "SELECT filename, added_via, added_by FROM documents ORDER BY id")
    assert [tuple(r) for r in rows] == [("letter.tif", "page", "page-admin"), ("scan.pdf", "page", "page-admin")]
    message, _ = _add_on_page(admin_pages, ["scan.pdf"], files)
    assert message.startswith("0 added, 1 already in the project.")


def test_a_reader_lists_searches_and_reads_a_document_at_its_page(app, client, admin_pages, files):
    _add_on_page(admin_pages, ["letter.tif", "scan.pdf"], files)
    letter, scan = [r[0] for r in sql(app, "SELECT id FROM documents ORDER BY id")]
    _ocr_done(app, letter, "quartz harbour lantern\fcopper falcon whisper\f")
    sign_in(app, client, "rita", roles=("reader",))
    assert client.get("/").headers["Location"].endswith("/documents")
    listing = client.get("/documents").get_data(as_text=True)
    assert "letter.tif" in listing and "scan.pdf" in listing
    assert "searchable" in listing and "queued" in listing
    found = client.get("/documents?q=falcon").get_data(as_text=True)
    assert "1 document matches" in found
    link = re.search(r'href="(/documents/\d+\?[^"]*)"', found).group(1).replace("&amp;", "&")
    assert f"/documents/{letter}?" in link and "page=2" in link and "q=falcon" in link
    shown = client.get(link).get_data(as_text=True)
    assert "<mark>falcon</mark>" in shown and 'id="page-2"' in shown
    assert "Page 2 of 2" in shown and "OCRed PDF (searchable)" in shown
    # The downloads carry the file's own name.
    original = client.get(f"/documents/{letter}/file/original")
    assert original.status_code == 200 and original.data == files["letter.tif"]
    assert "filename*=UTF-8''letter.tif" in original.headers["Content-Disposition"]
    ocr = client.get(f"/documents/{letter}/file/ocr")
    assert ocr.status_code == 200 and ocr.data.startswith(b"%PDF")
    assert "letter.ocr.pdf" in ocr.headers["Content-Disposition"]
    # Not yet OCRed: no OCRed PDF, and the page says the text comes later.
    assert client.get(f"/documents/{scan}/file/ocr").status_code == 404
    assert "once the document is OCRed" in client.get(f"/documents/{scan}").get_data(as_text=True)


def test_the_pages_read_in_chinese(app, client, admin_pages, files):
    _add_on_page(admin_pages, ["letter.tif"], files)
    (letter,) = sql(app, "SELECT id FROM documents")[0]
    _ocr_done(app, letter, "quartz harbour lantern\fcopper falcon whisper\f")
    sign_in(app, client, "rita", roles=("reader",))
    listing = client.get("/zh/documents").get_data(as_text=True)
    assert "文档" in listing and "可搜索" in listing
    found = client.get("/zh/documents?q=falcon").get_data(as_text=True)
    assert "1 个文档匹配" in found
    shown = client.get(f"/zh/documents/{letter}?q=falcon").get_data(as_text=True)
    assert "第 2 页，共 2 页" in shown


def test_only_readers_and_admins_read_documents(app, client, admin_pages, files):
    _add_on_page(admin_pages, ["scan.pdf"], files)
    (doc,) = sql(app, "SELECT id FROM documents")[0]
    sign_in(app, client, "wanda", roles=("worker",))
    for url in ("/documents", f"/documents/{doc}", f"/documents/{doc}/file/original"):
        assert client.get(url).status_code == 403, url
    client.cookie_jar.clear() if hasattr(client, "cookie_jar") else None
    with client.session_transaction() as session:
        session.clear()
    assert client.get("/documents").status_code == 302  # to the sign-in page
    sign_in(app, client, "rita", roles=("reader",))
    assert client.get("/documents/999999").status_code == 404
    assert client.get("/admin/projects/letters").status_code == 403


def test_the_development_reader_signs_in_on_loopback(app, client):
    app.config["DEV_MODE"], saved = True, app.config.get("DEV_MODE")
    try:
        login = client.get("/login").get_data(as_text=True)
        assert 'id="dev-reader-login"' in login
        token = re.search(r'name="csrf_token" value="([^"]+)"', login).group(1)
        response = client.post("/login/dev", data={"csrf_token": token, "as": "reader"})
        assert response.status_code == 303
        (roles,) = sql(app, "SELECT roles FROM users WHERE id = 'dev-reader'")[0]
        assert roles == ["reader"]
        assert client.get("/documents").status_code == 200
        assert client.get("/admin").status_code == 403
    finally:
        app.config["DEV_MODE"] = saved
