"""``flask fleet reindex``: the text index rebuilt from the archived PDFs, in
batches with progress, each paper read from the PDF its indexed text came
from, audited."""
from __future__ import annotations

import hashlib
import io

from tests import scans
from tests.helpers import Api, body, sql


def _search(app, words):
    from app.extensions import db
    from app.search.query import search
    with app.app_context():
        try:
            return [hit["canonical_key"] for hit in search(words)["results"]]
        finally:
            db.session.remove()


def _ocred_document(app, api, dirs, name: str, words: list[str]) -> str:  # noqa: F811
    """A document put in, and an OCR output archived for it the way the
    archive commit registers one (a PDF with a text layer)."""
    scan = scans.scanned_pdf(dirs.spool.parent / f"{name}.pdf", [words[:1]]).read_bytes()
    response = api.call("POST", f"/api/v1/fleethq/projects/docs/documents?filename={name}.pdf",
                        data=scan, content_type="application/octet-stream")
    doc = body(response)
    buffer = io.BytesIO()
    scans.text_page_pdf(words).save(buffer)
    ocr = buffer.getvalue()
    sha = hashlib.sha256(ocr).hexdigest()
    key = f"sha256/{sha[:2]}/{sha[2:4]}/{sha}.pdf"
    (dirs.objects / key).parent.mkdir(parents=True, exist_ok=True)
    (dirs.objects / key).write_bytes(ocr)
    sql(app, "INSERT INTO assets (canonical_key, sha256, size, object_key, project_id, derived_from) "
             "VALUES (:k, :s, :n, :o, 'docs', :src)",
        k=f"ocr:{doc['asset_key']}", s=sha, n=len(ocr), o=key, src=doc["asset_key"])
    return doc["asset_key"]


def test_reindex_rebuilds_a_lost_index_from_the_archived_pdfs(app, client, admin_token, dirs):  # noqa: F811
    api = Api(client, admin_token)
    api.put_project("docs", kind="documents")
    keys = [_ocred_document(app, api, dirs, f"letter-{n}", [f"quartz{n} harbour", "copper falcon"])
            for n in range(3)]
    # One stale row (text of another time) and two lost ones.
    from app.extensions import db
    from app.search.index import index_paper
    with app.app_context():
        index_paper(keys[0], "docs", "stale words only", derived_key=f"ocr:{keys[0]}")
        db.session.commit()
        db.session.remove()
    assert _search(app, "quartz0") == [] and _search(app, "stale") == [keys[0]]
    result = app.test_cli_runner().invoke(args=["fleet", "reindex", "--batch", "2"])
    assert result.exit_code == 0, result.output
    assert "reindexed 3 of 3 papers and documents, 3 pages" in result.stdout
    # A line of progress per batch of two.
    assert "reindex: 2/3 read" in result.stderr and "reindex: 3/3 read" in result.stderr
    for n, key in enumerate(keys):
        assert _search(app, f"quartz{n}") == [key]
    assert _search(app, "stale") == []
    rows = sql(app, "SELECT canonical_key, derived_key, project_id FROM paper_texts ORDER BY 1")
    assert [tuple(r) for r in rows] == [(k, f"ocr:{k}", "docs") for k in sorted(keys)]
    (audit,) = sql(app, "SELECT actor, details FROM audit_log WHERE action = 'search.reindex'")
    assert audit[1] == {"papers": 3, "pages": 3, "failed": 0}


def test_a_pdf_that_cannot_be_read_is_named_and_the_rest_go_on(app, client, admin_token, dirs):  # noqa: F811
    api = Api(client, admin_token)
    api.put_project("docs", kind="documents")
    good = _ocred_document(app, api, dirs, "good", ["velvet orchard compass"])
    bad = _ocred_document(app, api, dirs, "bad", ["lost words"])
    (obj,) = sql(app, "SELECT object_key FROM assets WHERE canonical_key = :k", k=f"ocr:{bad}")[0]
    (dirs.objects / obj).write_bytes(b"%PDF-1.4 broken")
    result = app.test_cli_runner().invoke(args=["fleet", "reindex"])
    assert result.exit_code == 1
    assert f"not reindexed {bad}:" in result.stderr
    assert "reindexed 1 of 2" in result.stdout
    assert _search(app, "velvet") == [good]
