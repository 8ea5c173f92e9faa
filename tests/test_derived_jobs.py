"""Derive consumers on the master: an archived paper enqueues one derived job
in another project (whatever the number of re-deliveries), the worker gets
its source over HTTPS at run time, uploads text and PDF, and the master
checks the derived PDF before archiving it as derived from its source."""
from __future__ import annotations

import hashlib
from urllib.parse import urlsplit

import pikepdf
import pytest

from tests import scans
from tests.fleet_helpers import Node, papers, pdf_project
from tests.helpers import Api, api_error, body, sql
from tests.support.uploads import archive

WORDS = [["quartz harbour lantern"], ["velvet orchard compass"]]


@pytest.fixture
def api(client, admin_token, dirs):
    return Api(client, admin_token)


@pytest.fixture(scope="module")
def pdfs(tmp_path_factory):
    d = tmp_path_factory.mktemp("derived")
    source = scans.scanned_pdf(d / "scan.pdf", WORDS)
    derived = _with_text_layer(source, d / "derived.pdf")
    one_page = scans.scanned_pdf(d / "one.pdf", WORDS[:1])
    return {"source": source.read_bytes(), "derived": derived.read_bytes(),
            "no_text": source.read_bytes(), "wrong_pages": _with_text_layer(one_page, d / "one-t.pdf").read_bytes()}


def _with_text_layer(source, path):
    """What OCR makes of a scan: the same pages plus invisible text in a font."""
    with pikepdf.open(source) as pdf:
        font = pdf.make_indirect(pikepdf.Dictionary(
            Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1, BaseFont=pikepdf.Name.Helvetica))
        for number, page in enumerate(pdf.pages):
            page.Resources.Font = pikepdf.Dictionary(F9=font)
            page.contents_add(pdf.make_stream(
                f"BT 3 Tr /F9 12 Tf 10 10 Td (page {number}) Tj ET".encode()), prepend=False)
        pdf.save(path)
    return path


def _derive(api, **profile):
    pdf_project(api, "papers")
    pdf_project(api, "papers-ocr")
    response = api.call("POST", "/api/v1/admin/projects/papers/hooks", {
        "name": "ocr", "kind": "derive", "target_project": "papers-ocr",
        "profile": {"name": "ocr", "languages": "eng+pol", **profile}})
    assert response.status_code == 201, body(response)
    return body(response)


def _archive_source(app, client, api, pdfs):
    assert api.enqueue("papers", papers(1)).status_code in (200, 201)
    node = Node(client, app)
    assert node.heartbeat().status_code == 200
    (job,) = body(node.claim("papers"))["jobs"]
    assert node.upload(job["attempt_id"], pdfs["source"]).status_code == 202
    assert archive(app, job["attempt_id"]) == "done"
    return node, job


def _derived_jobs(app):
    return sql(app, "SELECT id, value, attr, ext_id, state FROM jobs WHERE project_id = 'papers-ocr'")


def test_an_archived_paper_enqueues_one_derived_job_with_content_facts_only(app, client, api, pdfs):
    consumer = _derive(api)
    assert consumer["kind"] == "derive" and consumer["url"] is None
    assert consumer["target_project"] == "papers-ocr"
    _archive_source(app, client, api, pdfs)
    (job,) = _derived_jobs(app)
    assert job[1] == "10.1234/paper0"  # names the same paper
    assert job[2] == {"source_sha256": hashlib.sha256(pdfs["source"]).hexdigest(),
                      "size": len(pdfs["source"]), "pages": 2, "profile": "ocr",
                      "languages": "eng+pol"}
    (delivery,) = sql(app, "SELECT id, state, last_error FROM hook_deliveries")
    assert delivery[1] == "awaiting_callback"
    assert f"derived job {job[0]}" in delivery[2]
    # Its outbox row stays open (the reconciler looks again), not due now.
    (row,) = sql(app, "SELECT due_at > now() + interval '4 minutes' FROM outbox "
                      "WHERE topic = 'hook_delivery' AND ref = :d AND done_at IS NULL", d=delivery[0])
    assert row[0] is True


def test_a_hook_redelivered_three_times_makes_one_derived_job(app, client, api, pdfs):
    from app.extensions import db
    from app.hooks import deliveries
    _derive(api)
    _archive_source(app, client, api, pdfs)
    (delivery_id,) = sql(app, "SELECT id FROM hook_deliveries")[0]
    with app.app_context():
        for _ in range(3):
            assert deliveries.deliver(delivery_id, None, secret_key="k") == "awaiting_callback"
            deliveries.retry_now(delivery_id)  # an admin's retry too
        db.session.remove()
    assert len(_derived_jobs(app)) == 1
    assert sql(app, "SELECT count(*) FROM derived_jobs")[0][0] == 1


def test_the_backfill_derives_papers_archived_before_the_consumer(app, client, api, pdfs):
    from app.extensions import db
    from app.hooks import backfill, deliveries
    pdf_project(api, "papers")
    _archive_source(app, client, api, pdfs)
    _derive(api)  # added afterwards
    with app.app_context():
        backfill.ensure()
        (delivery_id,) = sql(app, "SELECT id FROM hook_deliveries")[0]
        deliveries.deliver(delivery_id, None, secret_key="k")
        db.session.remove()
    assert len(_derived_jobs(app)) == 1


def _claim_derived(client, app, node=None):
    node = node or Node(client, app)
    assert node.heartbeat().status_code == 200
    (job,) = body(node.claim("papers-ocr"))["jobs"]
    return node, job


def _put_text(node, attempt_id, data: bytes, sha=None):
    return node._call("PUT", f"/api/v1/fleet/uploads/{attempt_id}/text", data=data, headers={
        "Content-Type": "text/plain; charset=utf-8",
        "X-Text-SHA256": sha or hashlib.sha256(data).hexdigest()})


def test_the_worker_gets_its_source_over_https_and_the_derived_pdf_is_archived(app, client, api, pdfs):
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    response = node._call("GET", f"/api/v1/fleet/attempts/{job['attempt_id']}/source")
    assert response.status_code == 200, body(response)
    source = body(response)
    assert source["sha256"] == hashlib.sha256(pdfs["source"]).hexdigest()
    assert source["pages"] == 2 and source["languages"] == "eng+pol"
    link = urlsplit(source["url"])
    fetched = client.get(f"{link.path}?{link.query}")  # no bearer token needed
    assert fetched.status_code == 200 and fetched.data == pdfs["source"]

    # The PDF before its text is refused without touching the attempt.
    api_error(node.upload(job["attempt_id"], pdfs["derived"]), 400, "invalid_request")
    text = b"quartz harbour lantern\fvelvet orchard compass\n"
    assert _put_text(node, job["attempt_id"], text).status_code == 200
    assert node.upload(job["attempt_id"], pdfs["derived"]).status_code == 202
    assert archive(app, job["attempt_id"]) == "done"

    (asset,) = sql(app, "SELECT canonical_key, derived_from, pages, sha256 FROM assets "
                        "WHERE derived_from IS NOT NULL")
    assert asset[:3] == ("ocr:doi:10.1234/paper0", "doi:10.1234/paper0", 2)
    assert asset[3] == hashlib.sha256(pdfs["derived"]).hexdigest()
    assert sql(app, "SELECT state FROM hook_deliveries")[0][0] == "delivered"
    assert sql(app, "SELECT state FROM jobs WHERE project_id = 'papers-ocr'")[0][0] == "done"
    assert sql(app, "SELECT count(*) FROM upload_texts")[0][0] == 0  # indexed, then dropped


@pytest.mark.parametrize("name, reason", [("no_text", "no_text_layer"), ("wrong_pages", "page_count")])
def test_a_derived_pdf_that_is_not_its_sources_ocr_is_refused(app, client, api, pdfs, name, reason):
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    assert _put_text(node, job["attempt_id"], b"words").status_code == 200
    error = api_error(node.upload(job["attempt_id"], pdfs[name]), 422, "invalid_upload")
    assert error["details"]["reason"] == reason
    # As for any bad file: the attempt failed retryably, the job waits again.
    assert sql(app, "SELECT state FROM jobs WHERE project_id = 'papers-ocr'")[0][0] == "todo"


def test_pages_where_ocr_found_no_words_need_no_text_layer(app, client, api, pdfs):
    """Blank pages (a separator sheet, a photo without writing): OCR finds no
    word and its PDF has no font to show one; that is a result, not a fault."""
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    assert _put_text(node, job["attempt_id"], b" \n\f\n").status_code == 200
    assert node.upload(job["attempt_id"], pdfs["no_text"]).status_code == 202
    assert archive(app, job["attempt_id"]) == "done"
    assert sql(app, "SELECT state FROM jobs WHERE project_id = 'papers-ocr'")[0][0] == "done"


def test_a_derived_pdf_far_larger_than_its_source_is_refused(app, client, api, pdfs, tmp_path):
    from app.uploads import derived as derived_uploads
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    assert _put_text(node, job["attempt_id"], b"words").status_code == 200
    with pikepdf.open(_with_text_layer(scans.scanned_pdf(tmp_path / "s.pdf", WORDS), tmp_path / "d.pdf")) as pdf:
        padding = b"x" * (derived_uploads.SIZE_FACTOR * len(pdfs["source"])
                          + derived_uploads.SIZE_SLACK_BYTES)
        pdf.pages[0].contents_add(pdf.make_stream(b"% " + padding + b"\n"), prepend=False)
        pdf.save(tmp_path / "huge.pdf", compress_streams=False)
    error = api_error(node.upload(job["attempt_id"], (tmp_path / "huge.pdf").read_bytes()),
                      422, "invalid_upload")
    assert error["details"]["reason"] == "too_large_for_source"


def test_text_uploads_are_checked(app, client, api, pdfs):
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    aid = job["attempt_id"]
    assert api_error(_put_text(node, aid, b"abc", sha="0" * 64), 422, "invalid_upload")[
        "details"]["reason"] == "hash_mismatch"
    assert api_error(_put_text(node, aid, b"\xff\xfe"), 422, "invalid_upload")[
        "details"]["reason"] == "not_utf8"
    assert api_error(_put_text(node, aid, b"a\x00b"), 422, "invalid_upload")[
        "details"]["reason"] == "nul_character"
    api_error(_put_text(node, aid, b"abc", sha="xyz"), 400, "invalid_request")
    stranger = Node(client, app)
    api_error(_put_text(stranger, aid, b"abc"), 409, "stale_attempt")
    # An ordinary (not derived) attempt has no source.
    _, paper = _claim_derived_or_paper(client, app, api)
    api_error(node._call("GET", f"/api/v1/fleet/attempts/{paper['attempt_id']}/source"),
              409, "stale_attempt")


def _claim_derived_or_paper(client, app, api):
    assert api.enqueue("papers", papers(1, prefix="10.1234/more")).status_code in (200, 201)
    node = Node(client, app)
    assert node.heartbeat().status_code == 200
    (job,) = body(node.claim("papers"))["jobs"]
    return node, job


def test_a_source_that_already_has_text_finishes_the_derived_job_as_skipped(app, client, api, pdfs):
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    path = f"/api/v1/fleet/attempts/{job['attempt_id']}/skip"
    sent = _put_text(node, job["attempt_id"], b"born digital words\fsecond page")
    assert sent.status_code == 200, body(sent)
    response = node._call("POST", path, json={"reason": "already_has_text", "pages": 2})
    assert response.status_code == 200, body(response)
    assert body(response)["state"] == "done"
    assert node._call("POST", path, json={"reason": "already_has_text"}).status_code == 200  # replay
    assert sql(app, "SELECT state, outcome FROM attempts WHERE id = :a", a=int(job["attempt_id"]))[0] == (
        "done", {"skipped": "already_has_text", "pages": 2})
    assert sql(app, "SELECT state FROM hook_deliveries")[0][0] == "delivered"
    # The source's own text is indexed as the source's, then dropped.
    assert sql(app, "SELECT canonical_key, derived_key, pages FROM paper_texts") == [
        (sql(app, "SELECT canonical_key FROM assets")[0][0], None, 2)]
    assert sql(app, "SELECT count(*) FROM upload_texts")[0][0] == 0
    api_error(node._call("POST", path, json={"reason": "bored"}), 400, "invalid_request")


def test_a_failed_derived_job_fails_its_delivery_when_it_is_next_looked_at(app, client, api, pdfs):
    from app.extensions import db
    from app.hooks import deliveries
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    assert node.fail("papers-ocr", job, retryable=False, code="invalid_pdf").status_code == 200
    (delivery_id,) = sql(app, "SELECT id FROM hook_deliveries")[0]
    with app.app_context():
        assert deliveries.deliver(delivery_id, None, secret_key="k") == "failed"
        db.session.remove()
    assert "failed" in sql(app, "SELECT last_error FROM hook_deliveries")[0][0]


@pytest.mark.parametrize("payload, field", [
    ({"kind": "derive", "target_project": "papers-ocr"}, "profile"),
    ({"kind": "derive", "profile": {"name": "ocr"}}, "target_project"),
    ({"kind": "derive", "target_project": "papers", "profile": {"name": "ocr"}}, "target_project"),
    ({"kind": "derive", "target_project": "nope", "profile": {"name": "ocr"}}, "target_project"),
    ({"kind": "derive", "target_project": "papers-ocr", "profile": {"name": "OCR!"}}, "profile.name"),
    ({"kind": "derive", "target_project": "papers-ocr",
      "profile": {"name": "ocr", "languages": "eng;rm -rf"}}, "profile.languages"),
    ({"kind": "derive", "target_project": "papers-ocr", "profile": {"name": "ocr"},
      "url": "https://example.org/h"}, "url"),
    ({"kind": "webhook"}, "url"),
])
def test_derive_consumers_are_validated(api, payload, field):
    pdf_project(api, "papers")
    pdf_project(api, "papers-ocr")
    response = api.call("POST", "/api/v1/admin/projects/papers/hooks", {"name": "x", **payload})
    error = api_error(response, 400, "invalid_request")
    assert field in (error.get("details") or {}).get("field", "") or field in error["message"]


def test_the_text_of_an_attempt_that_failed_is_dropped_by_the_sweeper(app, client, api, pdfs):
    from app.extensions import db
    from app.uploads import sweeper
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    assert _put_text(node, job["attempt_id"], b"words").status_code == 200
    assert sql(app, "SELECT count(*) FROM upload_texts")[0][0] == 1
    with app.app_context():
        assert sweeper.sweep(app.config)["texts_dropped"] == 0  # its attempt still runs
        db.session.remove()
    assert node.fail("papers-ocr", job).status_code == 200
    with app.app_context():
        assert sweeper.sweep(app.config)["texts_dropped"] == 1
        db.session.remove()
    assert sql(app, "SELECT count(*) FROM upload_texts")[0][0] == 0


def test_a_text_over_its_limit_is_refused_before_it_is_stored(app, client, api, pdfs):
    from app.uploads import derived as derived_uploads
    _derive(api)
    _archive_source(app, client, api, pdfs)
    node, job = _claim_derived(client, app)
    api_error(_put_text(node, job["attempt_id"], b"a" * (derived_uploads.TEXT_MAX_BYTES + 1)),
              413, "too_large")
    # A page past the index's bound is refused at upload, not at the archive.
    error = api_error(_put_text(node, job["attempt_id"], b"a" * (64 * 1024 + 1)), 422, "invalid_upload")
    assert error["details"]["reason"] == "index_limits"
    assert sql(app, "SELECT count(*) FROM upload_texts")[0][0] == 0


def test_a_job_put_into_the_target_by_hand_is_adopted_not_duplicated(app, client, api, pdfs):
    _derive(api)
    # The same paper, enqueued by hand with other fields (unique_value identity).
    assert api.enqueue("papers-ocr", [{"value": "10.1234/paper0"}]).status_code in (200, 201)
    _archive_source(app, client, api, pdfs)
    (job,) = _derived_jobs(app)
    assert job[2] is None  # the hand-made job, kept as it was
    (identity,) = sql(app, "SELECT job_id FROM derived_jobs")
    assert identity[0] == job[0]
    assert sql(app, "SELECT state FROM hook_deliveries")[0][0] == "awaiting_callback"
