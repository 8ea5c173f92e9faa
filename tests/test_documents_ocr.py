"""Documents out: a scan put into a documents project is OCRed by a real
``fleethq-worker run --task ocr`` (Tesseract) through the derived-job path,
and its words are then found in the index under the document's key."""
from __future__ import annotations

import hashlib
from urllib.parse import quote

from tests import scans
from tests.helpers import body
from tests.test_ocr_pipeline import _ocr_worker, _search
from tests.worker_harness import archiver, fleet, master, publisher, sql  # noqa: F401

PAGES = [["quartz harbour lantern"], ["copper falcon whisper"]]


def _add(fleet, project, name, data):
    response = fleet.api.call("POST", f"/api/v1/fleethq/projects/{project}/documents?filename={quote(name)}",
                              data=data, content_type="application/octet-stream")
    assert response.status_code == 201, body(response)
    return body(response)


def test_a_scanned_tiff_put_in_becomes_searchable_text(fleet, tmp_path):
    project = "scans"
    fleet.api.put_project(project, kind="documents")
    data = scans.image_file(tmp_path / "letter.tif", PAGES, "TIFF", mode="1").read_bytes()
    assert len(data) < 10 * 1024  # far under the papers' minimum size
    doc = _add(fleet, project, "letter.tif", data)
    worker = _ocr_worker(fleet, project)
    counts = fleet.wait_settled(project, 1, timeout=180, proc=worker)
    assert counts["done"] == 1, worker.output()[-4000:]
    key = f"doc:{hashlib.sha256(data).hexdigest()}"
    (hit,) = _search(fleet.app, "falcon")
    assert (hit["canonical_key"], hit["page"]) == (key, 2)
    (asset,) = sql(fleet.app, "SELECT canonical_key, derived_from, pages FROM assets "
                              "WHERE derived_from IS NOT NULL")
    assert asset == {"canonical_key": f"ocr:{key}", "derived_from": key, "pages": 2}
    shown = body(fleet.api.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}"))
    assert (shown["state"], shown["searchable"], shown["ocr"]["asset_key"]) == ("done", True, f"ocr:{key}")
