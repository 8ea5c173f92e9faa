"""Documents out: a scan put into a documents project is OCRed by a real
``fleethq-worker run --task ocr`` (Tesseract) through the derived-job path,
and its words are then found in the index under the document's key."""
from __future__ import annotations

import hashlib
from urllib.parse import quote

from tests import scans
from tests.helpers import body, wait_for
from tests.support.ocr import _ocr_worker, _search
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


def test_an_ocr_host_that_sleeps_holding_documents_fails_none_and_finishes_all(fleet, tmp_path):
    """The first-choice OCR host is killed holding documents and left down past
    the old task timeout; nothing fails while they wait; started again on its
    volume it finishes every one, each archived once."""
    project = "scans"
    fleet.api.put_project(project, kind="documents", retry_backoff_seconds=0)
    # A task budget of 1 s + 30 s for its one page (under the policy's
    # minimum, set as an operator's SQL would): the old rule failed a job
    # waiting in the queue once this had passed since its first claim.
    sql(fleet.app, "UPDATE projects SET task_timeout_seconds = 1 WHERE id = :p", p=project)
    docs = [_add(fleet, project, f"page-{n}.tif", scans.image_file(
        tmp_path / f"page-{n}.tif", [[f"record {n} nebula cobalt"]], "TIFF",
        mode="1").read_bytes()) for n in range(3)]
    host = _ocr_worker(fleet, project, FLEETHQ_LEASE_SECONDS=15, FLEETHQ_CONCURRENCY=3)
    wait_for(lambda: len(sql(fleet.app, "SELECT 1 FROM attempts WHERE state = 'running'")) >= 2, 60,
             f"the host's claims\n{host.output()}")
    host.kill9()  # the host goes to sleep holding its jobs
    held = {r["job_id"] for r in sql(fleet.app, "SELECT job_id FROM attempts WHERE state = 'running'")}
    # Down until its leases ran out, then longer than the whole old budget,
    # swept all along as the clock would.
    def sweep():
        assert fleet.app.test_cli_runner().invoke(args=["fleet", "sweep"]).exit_code == 0
        return True
    wait_for(lambda: sweep() and not sql(fleet.app, "SELECT 1 FROM attempts WHERE state = 'running'"),
             60, "the sleeping host's leases to run out", interval=1)
    wait_for(lambda: sweep() and sql(fleet.app, "SELECT now() > max(created_at) + interval '33 seconds' AS past "
                                                "FROM attempts")[0]["past"], 60,
             "the whole old budget to pass", interval=1)
    rows = sql(fleet.app, "SELECT id, state, deadline_at FROM jobs WHERE project_id = :p", p=project)
    assert all(r["state"] == "todo" and r["deadline_at"] is None for r in rows), rows
    awake = fleet.worker(project, host.volume, approve=False, FLEETHQ_TASK="ocr",
                         FLEETHQ_CONCURRENCY=3, FLEETHQ_OCR_LANGUAGES="eng", FLEETHQ_OCR_NICE=0)
    counts = fleet.wait_settled(project, 3, timeout=240, proc=awake)
    assert counts["done"] == 3 and counts["failed"] == 0, awake.output()[-4000:]
    once = sql(fleet.app, "SELECT job_id, count(*) AS n FROM uploads WHERE state = 'done' "
                          "GROUP BY job_id")
    assert sorted(r["n"] for r in once) == [1, 1, 1]
    assert held <= {r["job_id"] for r in once}
    for doc in docs:
        shown = body(fleet.api.call("GET", f"/api/v1/fleethq/documents/{doc['document_id']}"))
        assert (shown["state"], shown["searchable"]) == ("done", True)
    assert [h["filename"] for h in
            body(fleet.api.call("GET", "/api/v1/fleethq/documents/search?q=nebula"))["results"]]


def test_a_typed_document_is_skipped_then_forced_through_ocr_by_a_new_profile(fleet, tmp_path):
    """Its first run finds text on every page and is skipped (its own text
    indexed); a re-OCR with mode force runs OCRmyPDF on it all the same, and
    that run's text becomes the indexed one."""
    project = "typed"
    fleet.api.put_project(project, kind="documents", retry_backoff_seconds=0)
    scans.text_page_pdf(["already typed words", "in a born digital letter"]).save(tmp_path / "typed.pdf")
    doc = _add(fleet, project, "typed.pdf", (tmp_path / "typed.pdf").read_bytes())
    worker = _ocr_worker(fleet, project)
    assert fleet.wait_settled(project, 1, timeout=120, proc=worker)["done"] == 1, worker.output()[-3000:]
    assert sql(fleet.app, "SELECT count(*) AS n FROM assets WHERE derived_from IS NOT NULL")[0]["n"] == 0
    answer = fleet.api.call("POST", f"/api/v1/fleethq/projects/{project}/documents/ocr", {
        "profile": {"name": "forced", "mode": "force"}, "document_ids": [doc["document_id"]]})
    assert body(answer)["queued"] == [doc["document_id"]], body(answer)
    assert fleet.wait_settled(project, 2, timeout=180, proc=worker)["done"] == 2, worker.output()[-3000:]
    (asset,) = sql(fleet.app, "SELECT canonical_key FROM assets WHERE derived_from IS NOT NULL")
    assert asset["canonical_key"] == f"forced:{doc['asset_key']}"
    (row,) = sql(fleet.app, "SELECT d.job_id = dj.job_id AS indexed, t.derived_key FROM documents d "
                            "JOIN derived_jobs dj ON dj.profile = 'forced' "
                            "JOIN paper_texts t ON t.canonical_key = d.asset_key")
    assert row == {"indexed": True, "derived_key": f"forced:{doc['asset_key']}"}
    hits = body(fleet.api.call("GET", "/api/v1/fleethq/documents/search?q=typed"))["results"]
    assert [h["document_id"] for h in hits] == [doc["document_id"]]
