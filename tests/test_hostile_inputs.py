"""One catalogue of hostile inputs, one case per line, across the machine API,
the fleet API, uploads, source imports and the pages.

Every case asserts the documented answer (status and error code in the
documented envelope), that nothing already accepted changed (a snapshot of
jobs, attempts, uploads, assets, users, tokens and nodes taken before and
after), and that the server still answers the next request.

The worker's fetcher refusals (SSRF targets) are a table of their own at the
end: addresses the worker must never connect to.
"""
from __future__ import annotations

import base64
import io
import json
from urllib.parse import urlsplit

import pytest
import zstandard

from tests.helpers import VERSION, api_error, body, db_rows, values
from tests.support.pages import sign_in
from tests.support.world import world  # noqa: F401 (fixture)

DEEP = "[" * 10_000 + "]" * 10_000
CLAIM = "/api/v1/projects/p/jobs/claim"
COMPLETE = "/api/v1/projects/p/jobs/complete"
FAIL = "/api/v1/projects/p/jobs/fail"
ENQUEUE = "/api/v1/admin/projects/p/jobs"
SOURCE = "/api/v1/admin/projects/p/source"
REGISTER = "/api/v1/fleet/register"
HEARTBEAT = "/api/v1/fleet/heartbeat"
GOOD_CLAIM = {"worker_id": "w1", "max_jobs": 1, "lease_seconds": 60}


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def _zstd_bomb() -> bytes:
    """A few KiB that expand to 1 GiB of newlines-free zeros."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=19).stream_writer(out, closefd=False) as writer:
        chunk = b"0" * (1 << 20)
        for _ in range(1024):
            writer.write(chunk)
    return out.getvalue()


def _upload_headers(data: bytes, **extra) -> dict:
    import hashlib
    return {"X-PDF-SHA256": hashlib.sha256(data).hexdigest(), "X-PDF-Size": str(len(data)),
            "Content-Type": "application/pdf", **extra}


def _b64(value: bytes) -> str:
    return base64.urlsafe_b64encode(value).decode().rstrip("=")


# (case id, method, path, who, body, content type, extra headers, status, code)
# Paths may name {attempt} (the node's attempt) and {job} (the generic job id).
J = "application/json"
API_CASES = [
    # ---- malformed and deeply nested JSON
    ("claim-truncated", "POST", CLAIM, "admin", b'{"worker_id": "w1", "max_jobs"', J, {}, 400, "invalid_request"),
    ("claim-deep", "POST", CLAIM, "admin", DEEP, J, {}, 400, "invalid_request"),
    ("claim-deep-objects", "POST", CLAIM, "admin", '{"a":' * 5000 + "1" + "}" * 5000, J, {}, 400, "invalid_request"),
    ("enqueue-deep", "POST", ENQUEUE, "admin", DEEP, J, {}, 400, "invalid_request"),
    ("enqueue-deep-attr", "POST", ENQUEUE, "admin",
     '{"jobs": [{"value": "v", "attr": ' + "[" * 3000 + "]" * 3000 + "}]}", J, {}, 400, "invalid_request"),
    ("register-deep", "POST", REGISTER, "none", DEEP, J, {}, 400, "invalid_request"),
    ("heartbeat-deep", "POST", HEARTBEAT, "node", DEEP, J, {}, 400, "invalid_request"),
    ("complete-deep", "POST", COMPLETE, "admin", DEEP, J, {}, 400, "invalid_request"),
    ("claim-not-utf8", "POST", CLAIM, "admin", b'{"worker_id": "\xff"}', J, {}, 400, "invalid_request"),
    ("claim-trailing", "POST", CLAIM, "admin", json.dumps(GOOD_CLAIM) + "{}", J, {}, 400, "invalid_request"),
    ("claim-array", "POST", CLAIM, "admin", "[]", J, {}, 400, "invalid_request"),
    ("claim-null", "POST", CLAIM, "admin", "null", J, {}, 400, "invalid_request"),
    ("claim-empty", "POST", CLAIM, "admin", "", J, {}, 400, "invalid_request"),
    # ---- wrong types
    ("claim-max_jobs-string", "POST", CLAIM, "admin", {**GOOD_CLAIM, "max_jobs": "1"}, J, {}, 400, "invalid_request"),
    ("claim-max_jobs-bool", "POST", CLAIM, "admin", {**GOOD_CLAIM, "max_jobs": True}, J, {}, 400, "invalid_request"),
    ("claim-worker_id-object", "POST", CLAIM, "admin", {**GOOD_CLAIM, "worker_id": {}}, J, {}, 400, "invalid_request"),
    ("complete-job_id-string", "POST", COMPLETE, "admin",
     {"worker_id": "w1", "items": [{"job_id": "1", "attempt_id": "1", "outcome": {"kind": "success"}}]},
     J, {}, 400, "invalid_request"),
    ("complete-items-object", "POST", COMPLETE, "admin", {"worker_id": "w1", "items": {}}, J, {}, 400, "invalid_request"),
    ("enqueue-jobs-string", "POST", ENQUEUE, "admin", {"jobs": "v"}, J, {}, 400, "invalid_request"),
    ("enqueue-value-number", "POST", ENQUEUE, "admin", {"jobs": [{"value": 5}]}, J, {}, 400, "invalid_job"),
    ("enqueue-attr-array", "POST", ENQUEUE, "admin", {"jobs": [{"value": "v", "attr": []}]}, J, {}, 400, "invalid_job"),
    ("heartbeat-capacity-string", "POST", HEARTBEAT, "node",
     {"capacity": "2", "browser_ok": True, "disk_free_bytes": 1, "spool_bytes": 0,
      "running_attempt_ids": []}, J, {}, 400, "invalid_request"),
    # ---- overlong strings and ids
    ("claim-worker_id-129", "POST", CLAIM, "admin", {**GOOD_CLAIM, "worker_id": "w" * 129}, J, {}, 400, "invalid_request"),
    ("claim-worker_id-100k", "POST", CLAIM, "admin", {**GOOD_CLAIM, "worker_id": "w" * 100_000}, J, {}, 400, "invalid_request"),
    ("project-id-300", "POST", "/api/v1/projects/" + "p" * 300 + "/jobs/claim", "admin", GOOD_CLAIM, J, {}, 404, "not_found"),
    ("enqueue-id-overlong", "POST", ENQUEUE, "admin", {"jobs": [{"id": "i" * 5000, "value": "v"}]}, J, {}, 400, "invalid_job"),
    ("enqueue-value-overlong", "POST", ENQUEUE, "admin", {"jobs": [{"value": "v" * 70_000}]}, J, {}, 400, "invalid_job"),
    ("user-id-overlong", "PUT", "/api/v1/admin/users/" + "u" * 300, "admin", {"roles": ["worker"]}, J, {}, 400, "invalid_request"),
    ("job-id-overlong", "GET", "/api/v1/admin/projects/p/jobs/" + "9" * 40, "admin", None, None, {}, 400, "invalid_request"),
    # ---- unknown fields
    ("claim-unknown-field", "POST", CLAIM, "admin", {**GOOD_CLAIM, "priority": 9}, J, {}, 400, "invalid_request"),
    ("enqueue-unknown-field", "POST", ENQUEUE, "admin", {"jobs": [{"value": "v", "color": "red"}]}, J, {}, 400, "invalid_job"),
    ("heartbeat-unknown-field", "POST", HEARTBEAT, "node",
     {"capacity": 2, "browser_ok": True, "disk_free_bytes": 1, "spool_bytes": 0,
      "running_attempt_ids": [], "admin": True}, J, {}, 400, "invalid_request"),
    ("register-unknown-field", "POST", REGISTER, "none",
     {"id": "n1", "name": "x", "enrollment_token": "t", "secret": "s", "role": "admin"}, J, {}, 400, "invalid_request"),
    # ---- negative, huge and non-finite numbers
    ("claim-max_jobs-negative", "POST", CLAIM, "admin", {**GOOD_CLAIM, "max_jobs": -1}, J, {}, 400, "invalid_request"),
    ("claim-max_jobs-huge", "POST", CLAIM, "admin", {**GOOD_CLAIM, "max_jobs": 10 ** 30}, J, {}, 400, "invalid_request"),
    ("claim-lease-huge", "POST", CLAIM, "admin", {**GOOD_CLAIM, "lease_seconds": 2 ** 63}, J, {}, 400, "invalid_request"),
    ("claim-nan", "POST", CLAIM, "admin", b'{"worker_id": "w1", "max_jobs": NaN, "lease_seconds": 60}', J, {}, 400, "invalid_request"),
    ("claim-infinity", "POST", CLAIM, "admin", b'{"worker_id": "w1", "max_jobs": Infinity, "lease_seconds": 60}', J, {}, 400, "invalid_request"),
    ("enqueue-1e400", "POST", ENQUEUE, "admin", b'{"jobs": [{"value": "v", "attr": {"n": 1e400}}]}', J, {}, 400, "invalid_request"),
    ("complete-job_id-2^70", "POST", COMPLETE, "admin",
     {"worker_id": "w1", "items": [{"job_id": 2 ** 70, "attempt_id": "1", "outcome": {"kind": "success"}}]},
     J, {}, 400, "invalid_request"),
    ("extend-negative", "POST", "/api/v1/projects/p/jobs/extend-lease", "admin",
     {"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1"}], "extend_seconds": -60}, J, {}, 400, "invalid_request"),
    ("heartbeat-capacity-negative", "POST", HEARTBEAT, "node",
     {"capacity": -1, "browser_ok": True, "disk_free_bytes": 1, "spool_bytes": 0,
      "running_attempt_ids": []}, J, {}, 400, "invalid_request"),
    ("project-qps-negative", "PUT", "/api/v1/admin/projects/q", "admin",
     {"status": "active", "dispatch_qps": -5}, J, {}, 400, "invalid_request"),
    # ---- wrong content types
    ("claim-text-plain", "POST", CLAIM, "admin", json.dumps(GOOD_CLAIM), "text/plain", {}, 400, "invalid_request"),
    ("claim-no-content-type", "POST", CLAIM, "admin", json.dumps(GOOD_CLAIM), None, {}, 400, "invalid_request"),
    ("claim-form", "POST", CLAIM, "admin", "worker_id=w1&max_jobs=1", "application/x-www-form-urlencoded", {}, 400, "invalid_request"),
    ("enqueue-xml", "POST", ENQUEUE, "admin", "<jobs/>", "application/xml", {}, 400, "invalid_request"),
    ("source-json", "POST", SOURCE, "admin", json.dumps({"jobs": []}), J, {}, 415, "invalid_request"),
    ("heartbeat-multipart", "POST", HEARTBEAT, "node", "x", "multipart/form-data; boundary=x", {}, 415, "unsupported_media_type"),
    # ---- missing and wrong tokens, revoked users and nodes, wrong roles
    ("claim-no-token", "POST", CLAIM, "none", GOOD_CLAIM, J, {}, 401, "invalid_machine_token"),
    ("admin-no-token", "GET", "/api/v1/admin/projects", "none", None, None, {}, 401, "invalid_machine_token"),
    ("claim-wrong-token", "POST", CLAIM, "none", GOOD_CLAIM, J,
     {"Authorization": "Bearer fhq_" + "A" * 43}, 401, "invalid_machine_token"),
    ("claim-basic-auth", "POST", CLAIM, "none", GOOD_CLAIM, J,
     {"Authorization": "Basic YWRtaW46YWRtaW4="}, 401, "invalid_machine_token"),
    ("claim-token-with-newline", "POST", CLAIM, "none", GOOD_CLAIM, J,
     {"Authorization": "Bearer fhq_abc\tdef"}, 401, "invalid_machine_token"),
    ("claim-revoked-user", "POST", CLAIM, "revoked", GOOD_CLAIM, J, {}, 401, "invalid_machine_token"),
    ("whoami-revoked-user", "GET", "/api/v1/whoami", "revoked", None, None, {}, 401, "invalid_machine_token"),
    ("heartbeat-revoked-node", "POST", HEARTBEAT, "revoked-node",
     {"capacity": 1, "browser_ok": True, "disk_free_bytes": 1, "spool_bytes": 0,
      "running_attempt_ids": []}, J, {}, 401, "invalid_machine_token"),
    ("claim-revoked-node", "POST", "/api/v1/projects/papers/jobs/claim", "revoked-node",
     {"worker_id": "x", "max_jobs": 1, "lease_seconds": 60}, J, {}, 401, "invalid_machine_token"),
    ("worker-token-on-admin", "GET", "/api/v1/admin/projects", "worker", None, None, {}, 403, "permission_denied"),
    ("worker-token-enqueues", "POST", ENQUEUE, "worker", {"jobs": values(1)}, J, {}, 403, "permission_denied"),
    ("node-secret-on-admin", "GET", "/api/v1/admin/projects", "node", None, None, {}, 403, "permission_denied"),
    ("session-cookie-on-api", "GET", "/api/v1/admin/projects", "session", None, None, {}, 401, "invalid_machine_token"),
    ("register-wrong-credential", "POST", REGISTER, "none",
     {"id": "n-bad-credential-0001", "name": "x", "enrollment_token": "fhqe_" + "x" * 40,
      "secret": "fhqn_" + "y" * 43}, J, {}, 403, "permission_denied"),
    # ---- text that is not Unicode: a lone surrogate, as a JSON escape
    ("complete-uri-surrogate", "POST", COMPLETE, "admin",
     r'{"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1", "outcome": {"kind": "success", '
     r'"uri": "https://example.org/\ud800"}}]}', J, {}, 400, "invalid_request"),
    ("complete-meta-surrogate", "POST", COMPLETE, "admin",
     r'{"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1", "outcome": {"kind": "success", '
     r'"meta": {"\udfff": "x"}}}]}', J, {}, 400, "invalid_request"),
    ("fail-message-surrogate", "POST", FAIL, "admin",
     r'{"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1", "retryable": true, '
     r'"error": {"code": "network", "message": "\ud800"}}]}', J, {}, 400, "invalid_request"),
    ("fail-details-surrogate", "POST", FAIL, "admin",
     r'{"worker_id": "w1", "items": [{"job_id": 1, "attempt_id": "1", "retryable": true, '
     r'"error": {"code": "network", "message": "m", "details": {"k": "\uDC00"}}}]}', J, {}, 400,
     "invalid_request"),
    ("heartbeat-last_error-surrogate", "POST", HEARTBEAT, "node",
     r'{"capacity": 1, "browser_ok": true, "disk_free_bytes": 1, "spool_bytes": 0, '
     r'"running_attempt_ids": [], "last_error": "disk \ud800"}', J, {}, 400, "invalid_request"),
    ("hook-name-surrogate", "POST", "/api/v1/admin/projects/p/hooks", "admin",
     r'{"name": "\ud800", "url": "https://hooks.example.org/in"}', J, {}, 400, "invalid_request"),
    ("hook-edit-name-surrogate", "PATCH", "/api/v1/admin/projects/p/hooks/1", "admin",
     r'{"name": "\ud800"}', J, {}, 400, "invalid_request"),
    # ---- bodies over the limits
    ("claim-over-8-mib", "POST", CLAIM, "admin", b" " * (8 * 1024 * 1024 + 1), J, {}, 400, "invalid_request"),
    ("heartbeat-over-64-kib", "POST", HEARTBEAT, "node", b" " * (64 * 1024 + 1), J, {}, 413, "too_large"),
    ("enqueue-over-8-mib", "POST", ENQUEUE, "admin", b" " * (8 * 1024 * 1024 + 1), J, {}, 400, "invalid_request"),
    # ---- source imports
    ("source-zstd-bomb", "POST", SOURCE, "admin", "bomb", "application/zstd", {}, 400, "invalid_job"),
    ("source-not-zstd", "POST", SOURCE, "admin", b"not zstd at all", "application/zstd", {}, 400, "invalid_job"),
    ("source-oversized-line", "POST", SOURCE, "admin", "long-line", "application/zstd", {}, 400, "invalid_job"),
    ("source-bad-json-line", "POST", SOURCE, "admin", "bad-line", "application/zstd", {}, 400, "invalid_job"),
]

UPLOAD = "/api/v1/fleet/uploads/{attempt}"
# (case id, body kind, extra headers, status, code); bodies come from tests.pdfs.
UPLOAD_CASES = [
    ("html-as-pdf", "html", {}, 422, "invalid_upload"),
    ("truncated", "truncated", {}, 422, "invalid_upload"),
    ("tiny", "tiny", {}, 422, "invalid_upload"),
    ("parser-bomb", "spinning", {}, 422, "invalid_upload"),
    ("inflates-200-mib", "inflating", {}, 422, "invalid_upload"),
    ("sha-mismatch", "good", {"X-PDF-SHA256": "0" * 64}, 422, "invalid_upload"),
    ("sha-not-hex", "good", {"X-PDF-SHA256": "z" * 64}, 400, "invalid_request"),
    ("size-not-number", "good", {"X-PDF-Size": "12kB"}, 400, "invalid_request"),
    ("size-negative", "good", {"X-PDF-Size": "-5"}, 400, "invalid_request"),
    ("size-over-limit", "good", {"X-PDF-Size": str(200 * 1024 * 1024)}, 413, "too_large"),
    ("download-result-not-base64", "good", {"X-Download-Result": "%%%"}, 400, "invalid_request"),
    ("download-result-not-object", "good", {"X-Download-Result": _b64(b"[1, 2]")}, 400, "invalid_request"),
    ("download-result-deep", "good", {"X-Download-Result": _b64(DEEP[:4000].encode())}, 400, "invalid_request"),
    ("source-url-overlong", "good", {"X-Source-URL": "https://e.org/" + "a" * 5000}, 400, "invalid_request"),
    ("strategy-overlong", "good", {"X-Download-Strategy": "s" * 5000}, 400, "invalid_request"),
    ("other-attempt", "good", {"path": "/api/v1/fleet/uploads/999999"}, 409, "stale_attempt"),
    ("attempt-path-traversal", "good", {"path": "/api/v1/fleet/uploads/..%2F..%2Fetc%2Fpasswd"}, 404, "not_found"),
]


def _source_body(kind: str, app) -> bytes:
    if kind == "bomb":
        return _zstd_bomb()
    if kind == "long-line":
        limit = app.config["SOURCE_MAX_LINE"]
        return _zstd(json.dumps({"value": "v" * (limit + 10)}).encode() + b"\n")
    if kind == "bad-line":
        return _zstd(b'{"value": "ok"}\n{"value": \n')
    return kind if isinstance(kind, bytes) else kind.encode()


def _send(world, method, path, who, payload, content_type, headers):
    client = world.client
    all_headers = {"X-Client-Version": VERSION}
    token = None if who == "session" else world.token(who)
    if token:
        all_headers["Authorization"] = f"Bearer {token}"
    all_headers.update(headers)
    if content_type:
        all_headers["Content-Type"] = content_type
    if isinstance(payload, (dict, list)):
        data = json.dumps(payload)
    elif content_type == "application/zstd" and isinstance(payload, str):
        data = _source_body(payload, world.app)
    else:
        data = payload
    return client.open(path.format(attempt=world.attempt["attempt_id"]), method=method,
                       data=data, headers=all_headers)


def _still_answers(world):
    assert world.client.get("/healthz").status_code == 200
    assert world.api.call("GET", "/api/v1/whoami").status_code == 200


@pytest.mark.parametrize("case, method, path, who, payload, content_type, headers, status, code",
                         API_CASES, ids=[c[0] for c in API_CASES])
def test_hostile_api_request(world, case, method, path, who, payload, content_type, headers,
                             status, code):
    if who == "session":  # a signed-in admin's cookie, and no bearer token
        sign_in(world.app, world.client)
    before = world.snapshot()
    response = _send(world, method, path, who, payload, content_type, headers)
    api_error(response, status, code)
    assert world.snapshot() == before
    _still_answers(world)


@pytest.fixture(scope="module")
def pdf_bodies(tmp_path_factory):
    from tests import pdfs
    d = tmp_path_factory.mktemp("hostile-pdfs")
    pdfs.make_pdf(d / "good.pdf", pages=2, target_bytes=40 * 1024, seed=7)
    pdfs.html_as_pdf(d / "html.pdf")
    pdfs.truncated_pdf(d / "good.pdf", d / "truncated.pdf", forge_eof=True)
    pdfs.tiny_pdf(d / "tiny.pdf")
    pdfs.spinning_pdf(d / "spinning.pdf")
    # The probe's file: 204 KiB that inflate to 200 MiB (it was archived).
    pdfs.spinning_pdf(d / "inflating.pdf", inflated_bytes=200 << 20, pad_to=204 * 1024)
    return {p.stem: p.read_bytes() for p in d.iterdir()}


@pytest.mark.parametrize("case, kind, headers, status, code", UPLOAD_CASES,
                         ids=[c[0] for c in UPLOAD_CASES])
def test_hostile_upload(world, pdf_bodies, case, kind, headers, status, code):
    data = pdf_bodies[kind]
    headers = dict(headers)
    path = headers.pop("path", UPLOAD)
    before = world.snapshot()
    response = world.client.put(path.format(attempt=world.attempt["attempt_id"]), data=data,
                                headers={**world.node.headers, **_upload_headers(data), **headers})
    error = api_error(response, status, code)
    if kind in ("spinning", "inflating"):
        assert error["details"]["reason"] == "too_inflated", error
    after = world.snapshot()
    if status == 422:
        # A permanent refusal fails the attempt and sends its job back to the
        # queue (DESIGN §8): that is the documented change, nothing else moves.
        changed = {k for k in after if after[k] != before[k]}
        assert changed <= {"jobs", "attempts", "uploads"}, changed
        assert db_rows(world.app, "SELECT state FROM jobs WHERE id = :j",
                       j=world.attempt["job_id"]) == [{"state": "todo"}]
    else:
        assert after == before
    _still_answers(world)


# ------------------------------------------------------------------- pages

XSS = '<script>alert("x")</script>'


@pytest.mark.parametrize("case, path, form", [
    ("enqueue-without-csrf", "/admin/projects/p/enqueue/values", {"values": "x"}),
    ("status-without-csrf", "/admin/projects/p/status", {"status": "archived"}),
    ("revoke-without-csrf", "/admin/users/wk/token/revoke", {}),
], ids=lambda v: v if isinstance(v, str) and not v.startswith("/") else None)
def test_a_form_post_without_its_csrf_token_changes_nothing(world, case, path, form):
    sign_in(world.app, world.client)
    before = world.snapshot()
    response = world.client.post(path, data=form)
    assert response.status_code == 400
    assert b"Form expired or forged" in response.data
    assert world.snapshot() == before
    _still_answers(world)


@pytest.mark.parametrize("target", [
    "https://evil.example/", "//evil.example/", "/\\evil.example", "https:evil.example",
    "javascript:alert(1)", "\\\\evil.example", "/%2F%2Fevil.example",
    "/admin\r\nSet-Cookie: x=1", "/admin\n", "/admin\t/x",
])
def test_an_open_redirect_in_next_stays_on_the_site(world, target):
    """A signed-in admin sent to /login?next=… is redirected at once: never
    off the site."""
    sign_in(world.app, world.client)
    response = world.client.get("/login", query_string={"next": target})
    assert response.status_code == 302
    location = response.headers["Location"]
    # A path on this site ("/%2F%2Fevil.example" is one), never another host.
    assert location.startswith("/") and not location.startswith(("//", "/\\"))
    assert urlsplit(location).netloc == "" and "\\" not in location
    assert location.isprintable(), "no control character reaches a header"
    _still_answers(world)


@pytest.mark.parametrize("sig", ["é" * 64, "\u202e" + "0" * 63, "0" * 64, ""])
def test_a_forged_download_signature_is_refused_cleanly(world, sig):
    """Any sig that is not the key's own, ASCII or not, answers 403 in the
    envelope (a non-ASCII one answered an unauthenticated 500)."""
    import time
    response = world.client.get("/api/v1/assets/pdf/some-key.pdf",
                                query_string={"expires": str(int(time.time()) + 600), "sig": sig})
    api_error(response, 403, "permission_denied")
    _still_answers(world)


@pytest.mark.parametrize("path", ["/admin/projects/p%00", "/api/v1/admin/projects/p%00",
                                  "/api/v1/admin/projects/p%00/hooks"])
def test_a_nul_in_a_path_is_refused_before_any_lookup(world, path):
    """PostgreSQL refuses NUL in text: a path naming one answered 500
    (found by tests/test_input_property.py); now 400 in the envelope, and the
    signed-in page the same refusal."""
    sign_in(world.app, world.client)
    before = world.snapshot()
    response = world.client.get(path, headers={"Authorization": f"Bearer {world.admin}"})
    assert response.status_code == 400, response.data[:300]
    if path.startswith("/api/"):
        assert api_error(response, 400, "invalid_request")["details"] == {"field": "project_id"}
    assert world.snapshot() == before
    _still_answers(world)


def test_api_answers_say_nosniff(world):
    """Every machine API answer, the hot path's and the error envelope
    included, tells browsers not to guess another content type."""
    job = world.job
    answers = {
        "hot-path completion": world.api.complete("p", [job]),
        "error envelope": world.api.call("GET", "/api/v1/admin/projects/nope"),
        "signed download refused": world.client.get("/api/v1/assets/x.pdf?expires=1&sig=0"),
        "openapi": world.client.get("/api/v1/openapi.json"),
    }
    for name, response in answers.items():
        assert response.headers.get("X-Content-Type-Options") == "nosniff", name
    assert answers["hot-path completion"].json["results"][0]["status"] == "applied"


@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("where", ["job value", "job attr", "job error"])
def test_markup_in_displayed_fields_is_escaped_in_both_languages(world, language, where):
    if where == "job value":
        world.api.enqueue("p", [{"id": "x1", "value": XSS}])
        page = "/admin/projects/p"
    elif where == "job attr":
        world.api.enqueue("p", [{"id": "x2", "value": "v", "attr": {"note": XSS}}])
        job_id = db_rows(world.app, "SELECT id FROM jobs WHERE ext_id = 'x2'")[0]["id"]
        page = f"/admin/jobs/{job_id}"
    else:
        [job] = body(world.api.claim("p", worker_id="w1", max_jobs=1))["jobs"]
        world.api.call("POST", "/api/v1/projects/p/jobs/fail", {"worker_id": "w1", "items": [{
            "job_id": job["job_id"], "attempt_id": job["attempt_id"], "retryable": False,
            "error": {"code": "fetch", "message": XSS}}]})
        page = "/admin/projects/p?status=failed"
    sign_in(world.app, world.client)
    response = world.client.get(f"/{language}{page}")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert XSS not in html
    assert "<script>alert" not in html


# -------------------------------------------------------- the worker's fetcher

@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"),
    ("127.8.8.8", "loopback"),
    ("10.0.0.7", "private"),
    ("172.16.4.4", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link_local"),   # the cloud metadata service
    ("100.64.0.1", "cgnat"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("::1", "loopback"),
    ("fe80::1", "link_local"),
    ("fc00::1", "private"),
    ("::ffff:127.0.0.1", "loopback"),       # IPv4-mapped IPv6
    ("::ffff:169.254.169.254", "link_local"),
    ("2002:7f00:1::", "private"),  # 6to4 (of 127.0.0.1): the whole 2002::/16
    ("64:ff9b::a9fe:a9fe", "reserved"),  # NAT64 of the metadata address
])
def test_the_fetcher_refuses_non_public_targets(address, reason):
    from workers.fetch.addresses import refusal
    assert refusal(address) == reason


def test_the_fetcher_allows_a_public_address():
    from workers.fetch.addresses import refusal
    assert refusal("93.184.216.34") is None and refusal("2606:2800:220:1::1") is None


@pytest.mark.parametrize("answers, reason", [
    (["93.184.216.34", "127.0.0.1"], "mixed_dns_answer"),   # DNS rebinding: one public, one not
    (["10.1.1.1"], "private"),
    (["::ffff:10.0.0.1"], "private"),
])
def test_the_fetcher_refuses_a_name_resolving_into_private_space(monkeypatch, answers, reason):
    import socket

    from workers.fetch import addresses
    from workers.fetch.types import Blocked

    def fake(host, port, type=None):  # noqa: A002 - getaddrinfo's own keyword
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in answers]
    monkeypatch.setattr(addresses, "getaddrinfo", fake)
    with pytest.raises(Blocked) as refused:
        addresses.resolve("papers.example", 443)
    assert refused.value.details["reason"] == reason
