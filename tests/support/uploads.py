"""Uploads shared by the upload, spool, held-file, archive and page tests:
the ``files`` (synthetic PDFs, good and bad) and ``dirs`` (spool and object
store under tmp_path) fixtures, and helpers that claim, upload, archive and
read rows back."""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import socket

import pytest
from sqlalchemy import text

from tests import pdfs
from tests.fleet_helpers import Node, papers, pdf_project
from tests.helpers import Api, body, wait_for
from tests.helpers import db_rows as rows

RECEIPT_KEYS = {"job_id", "attempt_id", "state", "sha256", "size", "asset_key", "error"}

_MISSING = object()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bytes of the synthetic PDFs, good and bad (made once per module)."""
    d = tmp_path_factory.mktemp("pdfs")
    pdfs.make_pdf(d / "good.pdf", pages=3, target_bytes=64 * 1024, seed=1)
    pdfs.make_pdf(d / "other.pdf", pages=3, target_bytes=80 * 1024, seed=2)
    pdfs.make_pdf(d / "big.pdf", pages=4, target_bytes=8 * 1024 * 1024, seed=3)
    pdfs.html_as_pdf(d / "html.pdf")
    pdfs.truncated_pdf(d / "good.pdf", d / "truncated.pdf", forge_eof=True)
    pdfs.tiny_pdf(d / "tiny.pdf")
    pdfs.spinning_pdf(d / "spinning.pdf")
    return {p.stem: p.read_bytes() for p in d.iterdir()}


@pytest.fixture
def dirs(app, tmp_path):
    """Spool and object store under tmp_path (restored afterwards)."""
    spool, objects = tmp_path / "spool", tmp_path / "objects"
    spool.mkdir()
    objects.mkdir()
    new = {"SPOOL_DIR": str(spool), "OBJECT_STORE_DIR": str(objects), "S3_BUCKET": None,
           "SPOOL_MAX_BYTES": 2 * 1024**3}
    saved = {key: app.config.get(key, _MISSING) for key in new}
    app.config.update(new)
    try:
        yield type("Dirs", (), {"spool": spool, "objects": objects})
    finally:
        for key, value in saved.items():
            if value is _MISSING:
                app.config.pop(key, None)
            else:
                app.config[key] = value


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def start(app, client, api, project="papers", n=1, *, node=None, **policy):
    """A pdf project with ``n`` papers claimed by one (new) node."""
    pdf_project(api, project, **policy)
    response = api.enqueue(project, papers(n))
    assert response.status_code in (200, 201), body(response)
    node = node or Node(client, app)
    assert node.heartbeat().status_code == 200
    response = node.claim(project, max_jobs=n)
    assert response.status_code == 200, body(response)
    jobs = body(response)["jobs"]
    assert len(jobs) == n
    return node, jobs


def token_worker_claims_a_paper(client, api, token: str, worker_id: str) -> tuple[Api, dict]:
    """A pdf project with one paper, claimed by a token worker (user machine token + worker id)."""
    worker = Api(client, token)
    pdf_project(api, "papers")
    assert api.enqueue("papers", papers(1)).status_code in (200, 201)
    beat = worker.call("POST", "/api/v1/fleet/heartbeat", {
        "capacity": 1, "browser_ok": True, "disk_free_bytes": 10**10, "spool_bytes": 0,
        "running_attempt_ids": [], "worker_id": worker_id})
    assert beat.status_code == 200, body(beat)
    claimed = worker.claim("papers", worker_id=worker_id, max_jobs=1)
    assert claimed.status_code == 200, body(claimed)
    (job,) = body(claimed)["jobs"]
    return worker, job


def one(app, sql, **params) -> dict:
    found = rows(app, sql, **params)
    assert len(found) == 1, found
    return found[0]


def execute(app, sql, **params) -> int:
    from app.extensions import db
    with app.app_context():
        count = db.session.execute(text(sql), params).rowcount
        db.session.commit()
        db.session.remove()
    return count


def job_row(app, job_id) -> dict:
    return one(app, "SELECT state, current_attempt_id, last_error, resets FROM jobs WHERE id = :j",
               j=int(job_id))


def attempt_row(app, attempt_id) -> dict:
    return one(app, "SELECT state, error, lease_expires_at FROM attempts WHERE id = :a",
               a=int(attempt_id))


def upload_rows(app, attempt_id) -> list[dict]:
    return rows(app, "SELECT * FROM uploads WHERE attempt_id = :a", a=int(attempt_id))


def reserved(app) -> int:
    found = rows(app, "SELECT reserved_bytes FROM spool_usage WHERE id = 1")
    return int(found[0]["reserved_bytes"]) if found else 0


def archive(app, attempt_id) -> str:
    import app.storage as storage
    from app.extensions import db
    from app.uploads import archive as archive_mod
    with app.app_context():
        try:
            return archive_mod.commit(int(attempt_id), storage.from_config(app.config))
        finally:
            db.session.remove()


def spool_names(dirs) -> list[str]:
    return sorted(os.listdir(dirs.spool))


def object_path(dirs, digest: str):
    return dirs.objects / "sha256" / digest[:2] / digest[2:4] / f"{digest}.pdf"


def error_of(response) -> dict:
    return body(response)["error"]


def upload_head(port: int, node: Node, attempt_id: str, digest: str, size: int,
                content_length: int | None = None, extra: dict | None = None) -> bytes:
    """The request line and headers of an upload, as raw bytes."""
    headers = {"Host": f"127.0.0.1:{port}", **node.headers, "X-PDF-SHA256": digest,
               "X-PDF-Size": str(size), "Content-Type": "application/pdf",
               "Content-Length": str(size if content_length is None else content_length),
               **(extra or {})}
    lines = [f"PUT /api/v1/fleet/uploads/{attempt_id} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()

@contextlib.contextmanager


def streaming_upload(app, port: int, node, job: dict, data: bytes, headers: dict | None = None):
    """An upload over a raw socket that has sent its first 4 KiB and is being
    streamed by the master (the attempt is uploading); yields the socket."""
    head_of = node if headers is None else type("Caller", (), {"headers": headers})()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(upload_head(port, head_of, job["attempt_id"], sha(data), len(data)))
        sock.sendall(data[:4096])
        wait_for(lambda: attempt_row(app, job["attempt_id"])["state"] == "uploading")
        yield sock


def read_response(sock) -> tuple[int, dict, dict]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    raw = response.read()
    return response.status, dict(response.getheaders()), json.loads(raw) if raw else {}


def assert_receipt(data: dict, *, job_id, attempt_id, state, digest, size):
    assert set(data) == RECEIPT_KEYS, data
    assert type(data["job_id"]) is int and data["job_id"] == int(job_id)
    assert data["attempt_id"] == str(attempt_id)
    assert data["state"] == state
    assert data["sha256"] == digest
    assert data["size"] == size


def _age_lease(app, job):
    execute(app, "UPDATE attempts SET lease_expires_at = now() - interval '5 seconds' WHERE id = :a",
            a=int(job["attempt_id"]))
    execute(app, "UPDATE jobs SET lease_expires_at = now() - interval '5 seconds' WHERE id = :j",
            j=int(job["job_id"]))


def _reap(app):
    from app.extensions import db
    from app.projects import leasing
    with app.app_context():
        result = leasing.sweep()
        db.session.remove()
    return result
