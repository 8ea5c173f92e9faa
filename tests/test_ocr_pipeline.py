"""The OCR pipeline end to end, with real parts: PostgreSQL, Redis and a
Dramatiq archiver, the master over HTTP, Tesseract, and ``fleethq-worker
run --task ocr`` as real processes.

A scanned paper (rendered words as images, no text layer) is archived in a
source project; its derive consumer enqueues a job into the OCR project;
an OCR worker downloads the source over HTTP at run time, OCRs it, uploads
text and PDF; the master archives the derived PDF and indexes the text; the
words are then found by search. Each failure class of the OCR task, a node
going away mid-job and a master restart are covered too.
"""
from __future__ import annotations

import hashlib


from tests import scans
from tests.fleet_helpers import Node
from tests.helpers import body, wait_for
from tests.worker_harness import archiver, fleet, master, publisher, sql  # noqa: F401
from tests.support.ocr import (_ocr_worker, _search)  # noqa: F401

PAGES = [["quartz harbour lantern", "meadow thunder violin"],
         ["copper falcon whisper", "granite orchid sailor"]]
SCAN_WORDS = {"quartz", "lantern", "meadow", "violin", "falcon", "granite", "orchid", "sailor"}


def _pipeline(fleet, *, languages="eng", **ocr_policy):
    source, target = fleet.project(), fleet.project(**{"max_resets": 3, **ocr_policy})
    response = fleet.api.call("POST", f"/api/v1/admin/projects/{source}/hooks", {
        "name": "ocr", "kind": "derive", "target_project": target,
        "profile": {"name": "ocr", "languages": languages}})
    assert response.status_code == 201, body(response)
    return source, target


def _archive(fleet, client, source: str, pdf_bytes: bytes, value: str) -> int:
    """Put one paper into the archive as a fetch worker would (over the API)."""
    assert fleet.api.enqueue(source, [{"value": value}]).status_code in (200, 201)
    node = Node(client, fleet.app)
    assert node.heartbeat().status_code == 200
    (job,) = body(node.claim(source))["jobs"]
    response = node.upload(job["attempt_id"], pdf_bytes)
    assert response.status_code == 202, body(response)
    wait_for(lambda: sql(fleet.app, "SELECT 1 FROM jobs WHERE id = :j AND state = 'done'",
                         j=job["job_id"]), 30, "the source's archive")
    return job["job_id"]


def _tmp_files(worker) -> list[str]:
    return [str(p) for p in (worker.volume / "tmp").glob("**/*") if p.is_file()]


def _job(app, project):
    (row,) = sql(app, "SELECT id, state, last_error FROM jobs WHERE project_id = :p", p=project)
    return row


def test_a_scanned_paper_becomes_searchable_by_its_words(fleet, client, tmp_path):
    source, target = _pipeline(fleet)
    scan = scans.scanned_pdf(tmp_path / "scan.pdf", PAGES).read_bytes()
    _archive(fleet, client, source, scan, "10.5555/scan1")
    worker = _ocr_worker(fleet, target)
    counts = fleet.wait_settled(target, 1, timeout=180, proc=worker)
    assert counts["done"] == 1, worker.output()[-4000:]

    (asset,) = sql(fleet.app, "SELECT canonical_key, derived_from, pages FROM assets "
                              "WHERE derived_from IS NOT NULL")
    assert asset == {"canonical_key": "ocr:doi:10.5555/scan1",
                     "derived_from": "doi:10.5555/scan1", "pages": 2}
    (delivery,) = sql(fleet.app, "SELECT state FROM hook_deliveries")
    assert delivery["state"] == "delivered"
    for word in ("lantern", "falcon orchid"):
        (hit,) = _search(fleet.app, word)
        assert hit["canonical_key"] == "doi:10.5555/scan1"
    # The worker's copies are gone after the receipt.
    wait_for(lambda: not worker.files(), 20, f"the worker's files to go: {worker.files()}")
    assert worker.states() == {"done": 1}


def test_a_source_that_already_has_text_is_finished_as_skipped(fleet, client, tmp_path):
    source, target = _pipeline(fleet)
    born_digital = scans.text_page_pdf(["already typed words"])
    # A comment in the content stream takes it over the master's upload minimum.
    born_digital.pages[0].contents_add(born_digital.make_stream(b"%" + b"p" * 12 * 1024 + b"\n"))
    born_digital.save(tmp_path / "typed.pdf", compress_streams=False)
    _archive(fleet, client, source, (tmp_path / "typed.pdf").read_bytes(), "10.5555/typed")
    worker = _ocr_worker(fleet, target)
    counts = fleet.wait_settled(target, 1, timeout=120, proc=worker)
    assert counts["done"] == 1, worker.output()[-4000:]
    (attempt,) = sql(fleet.app, "SELECT outcome FROM attempts WHERE project_id = :p", p=target)
    assert attempt["outcome"]["skipped"] == "already_has_text"
    assert sql(fleet.app, "SELECT state FROM hook_deliveries")[0]["state"] == "delivered"
    # Not OCRed, still found by its own words; no derived asset, no text left over.
    (hit,) = _search(fleet.app, "typed words")
    assert hit["canonical_key"] == "doi:10.5555/typed"
    assert sql(fleet.app, "SELECT count(*) AS n FROM assets WHERE derived_from IS NOT NULL")[0]["n"] == 0
    assert sql(fleet.app, "SELECT count(*) AS n FROM upload_texts")[0]["n"] == 0
    wait_for(lambda: not worker.files(), 20, f"the worker's files to go: {worker.files()}")


def test_an_encrypted_source_fails_for_good_without_retries(fleet, client, tmp_path):
    source, target = _pipeline(fleet)
    scan = scans.scanned_pdf(tmp_path / "scan.pdf", PAGES)
    locked = scans.encrypted_pdf(scan, tmp_path / "locked.pdf", user_password="").read_bytes()
    _archive(fleet, client, source, locked, "10.5555/locked")
    worker = _ocr_worker(fleet, target)
    counts = fleet.wait_settled(target, 1, timeout=120, proc=worker)
    assert counts["failed"] == 1, worker.output()[-4000:]
    assert sql(fleet.app, "SELECT count(*) AS n FROM attempts WHERE project_id = :p", p=target)[0]["n"] == 1


def test_a_run_past_its_time_limit_is_retried_on_another_try(fleet, client, tmp_path):
    # prefer_new_worker off: the test node that archived the source would count
    # as a fresh worker that has not tried the job, and hold back the retry.
    source, target = _pipeline(fleet, max_resets=1, prefer_new_worker=False)
    scan = scans.scanned_pdf(tmp_path / "scan.pdf", PAGES).read_bytes()
    _archive(fleet, client, source, scan, "10.5555/slow")
    worker = _ocr_worker(fleet, target, FLEETHQ_OCR_BASE_SECONDS="0.5",
                         FLEETHQ_OCR_SECONDS_PER_PAGE="0.01")
    counts = fleet.wait_settled(target, 1, timeout=120, proc=worker)
    assert counts["reset_exhausted"] == 1, worker.output()[-4000:]
    errors = sql(fleet.app, "SELECT error FROM attempts WHERE project_id = :p ORDER BY id", p=target)
    assert len(errors) == 2  # retried, each time past the limit
    assert all(e["error"]["retryable"] and e["error"]["error"]["code"] == "timeout" for e in errors)


def test_a_worker_missing_a_language_pack_stops_claiming_and_says_why(fleet, client, tmp_path):
    source, target = _pipeline(fleet, languages="eng+fra")  # no French pack on this machine
    scan = scans.scanned_pdf(tmp_path / "scan.pdf", PAGES).read_bytes()
    _archive(fleet, client, source, scan, "10.5555/french")
    worker = _ocr_worker(fleet, target)
    ident = worker.identity()["worker_id"]
    row = wait_for(lambda: (sql(fleet.app, "SELECT last_error, capacity FROM fleet_nodes WHERE id = :n",
                                n=ident) or [None])[0], 5, "the node row")
    wait_for(lambda: (sql(fleet.app, "SELECT last_error FROM fleet_nodes WHERE id = :n", n=ident)[0]
                      ["last_error"] or "").startswith("broken:"), 60,
             f"a broken heartbeat\n{worker.output()[-3000:]}")
    row = sql(fleet.app, "SELECT last_error, capacity FROM fleet_nodes WHERE id = :n", n=ident)[0]
    assert "fra" in row["last_error"] and row["capacity"] == 0
    # One attempt failed retryably; the job waits for a worker that can do it.
    wait_for(lambda: _job(fleet.app, target)["state"] == "todo", 30, "the job back in the queue")
    assert "claims paused: this worker cannot do its task" in worker.output()
    assert sql(fleet.app, "SELECT count(*) AS n FROM attempts WHERE project_id = :p", p=target)[0]["n"] == 1


def test_a_worker_that_starts_without_its_language_packs_never_claims(fleet, client, tmp_path):
    source, target = _pipeline(fleet)
    scan = scans.scanned_pdf(tmp_path / "scan.pdf", PAGES).read_bytes()
    _archive(fleet, client, source, scan, "10.5555/never")
    worker = _ocr_worker(fleet, target, FLEETHQ_OCR_LANGUAGES="eng+zzz")
    ident = worker.identity()["worker_id"]
    wait_for(lambda: (sql(fleet.app, "SELECT last_error FROM fleet_nodes WHERE id = :n", n=ident)[0]
                      ["last_error"] or "").startswith("broken:"), 60,
             f"a broken heartbeat\n{worker.output()[-3000:]}")
    assert sql(fleet.app, "SELECT count(*) AS n FROM attempts WHERE project_id = :p", p=target)[0]["n"] == 0


def test_the_fallback_lane_finishes_the_job_of_a_node_that_went_away(fleet, client, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setitem(fleet.app.config, "NODE_LEASE_S", 6)
    source, target = _pipeline(fleet, fallback_after_seconds=1)
    pages = [[f"line {n} nebula cobalt"] for n in range(6)]  # long enough to kill mid-run
    scan = scans.scanned_pdf(tmp_path / "scan.pdf", pages).read_bytes()
    _archive(fleet, client, source, scan, "10.5555/away")
    remote = _ocr_worker(fleet, target, FLEETHQ_LEASE_SECONDS=15)
    wait_for(lambda: remote.states().get("downloading") == 1, 60, f"the remote's claim\n{remote.output()}")
    local = _ocr_worker(fleet, target)
    local_id = local.identity()["worker_id"]
    assert fleet.app.test_cli_runner().invoke(args=["fleet", "set-tier", local_id, "fallback"]).exit_code == 0
    remote.kill9()
    counts = fleet.wait_settled(target, 1, timeout=240, proc=local)
    assert counts["done"] == 1, local.output()[-4000:]
    (done_by,) = sql(fleet.app, "SELECT worker_id FROM uploads WHERE project_id = :p AND state = 'done'",
                     p=target)
    assert done_by["worker_id"] == local_id
    assert _search(fleet.app, "nebula")


def test_a_master_restart_mid_run_loses_nothing(fleet, client, tmp_path):
    source, target = _pipeline(fleet)
    scan = scans.scanned_pdf(tmp_path / "scan.pdf", PAGES).read_bytes()
    _archive(fleet, client, source, scan, "10.5555/restart")
    worker = _ocr_worker(fleet, target)
    # Stopped once the source is on the volume and OCR runs.
    wait_for(lambda: any("/ocr/" in f for f in _tmp_files(worker)), 60,
             f"the OCR run\n{worker.output()}")
    fleet.master.stop()
    # The OCR finishes while the master is away; the files wait on the volume.
    wait_for(lambda: worker.states().get("ready") == 1, 120, f"a ready file\n{worker.output()[-3000:]}")
    fleet.master.start()
    counts = fleet.wait_settled(target, 1, timeout=120, proc=worker)
    assert counts["done"] == 1, worker.output()[-4000:]
    assert _search(fleet.app, "whisper")
    digest = sql(fleet.app, "SELECT sha256 FROM assets WHERE derived_from IS NOT NULL")[0]["sha256"]
    assert digest != hashlib.sha256(scan).hexdigest()
