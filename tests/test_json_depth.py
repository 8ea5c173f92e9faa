"""JSON nested past the documented limit (workers.wire.protocol.MAX_JSON_DEPTH)
is a clear 400 on every entry point that parses JSON, over real HTTP, and
leaves no traceback in the log: the decoder's RecursionError never escapes."""
from __future__ import annotations

import base64
import io
import logging
import re

import pytest
import requests

from tests.helpers import Api
from workers.wire.protocol import MAX_JSON_DEPTH

DEEP = "[" * 10_000 + "]" * 10_000  # what used to answer 500
JUST_OVER = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
FLASH_RE = re.compile(r'<p class="flash flash-(\w+)" role="status">(.*?)</p>', re.S)


@pytest.fixture
def quiet_log(caplog, capfd):
    """Yields a check that nothing was logged with a traceback, in records or on stderr."""
    caplog.set_level(logging.DEBUG)

    def check():
        with_exc = [r.getMessage() for r in caplog.records if r.exc_info]
        assert with_exc == [], with_exc
        assert "Traceback" not in caplog.text
        assert "Traceback" not in capfd.readouterr().err
    return check


@pytest.fixture
def http(live_server, admin_token):
    session = requests.Session()
    api = Api(session, admin_token, base=live_server.url)
    api.put_project("deep", identity_mode="none")
    return api


def _refused(response, code="invalid_request", status=400) -> dict:
    assert response.status_code == status, (response.status_code, response.text[:300])
    err = response.json()["error"]
    assert err["code"] == code, err
    assert f"deeper than {MAX_JSON_DEPTH} levels" in err["message"], err
    return err


def _raw(http, method, path, data: str, **headers):
    return http.call(method, path, None, data=data.encode(),
                     headers={"Content-Type": "application/json", **headers})


@pytest.mark.parametrize("payload", [DEEP, JUST_OVER, '{"worker_id": "w1", "x": ' + DEEP + "}"])
def test_claim(http, quiet_log, payload):
    err = _refused(_raw(http, "POST", "/api/v1/projects/deep/jobs/claim", payload))
    assert err["details"] == {"max_depth": MAX_JSON_DEPTH}
    quiet_log()


def test_nesting_up_to_the_limit_is_still_read(http, quiet_log):
    """A body exactly at the limit reaches the validator (which names the field)."""
    inner = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    response = _raw(http, "POST", "/api/v1/projects/deep/jobs/claim",
                    '{"worker_id": "w1", "max_jobs": ' + inner + ', "lease_seconds": 60}')
    assert response.status_code == 400
    assert response.json()["error"]["details"] == {"field": "max_jobs"}
    quiet_log()


def test_enqueue(http, quiet_log):
    _refused(_raw(http, "POST", "/api/v1/admin/projects/deep/jobs", '{"jobs": ' + DEEP + "}"))
    deep_attr = '{"jobs": [{"value": "v", "attr": {"a": ' + DEEP + "}}]}"
    _refused(_raw(http, "POST", "/api/v1/admin/projects/deep/jobs", deep_attr))
    assert http.counts("deep")["todo"] == 0
    quiet_log()


def test_fleet_register_before_any_credential_is_checked(live_server, quiet_log):
    response = requests.post(f"{live_server.url}/api/v1/fleet/register", data=DEEP,
                             headers={"Content-Type": "application/json"})
    _refused(response)
    quiet_log()


def test_heartbeat(http, quiet_log):
    _refused(_raw(http, "POST", "/api/v1/fleet/heartbeat", DEEP))
    quiet_log()


def test_upload_download_result_header(http, quiet_log):
    deep = "[" * 5000 + "]" * 5000
    encoded = base64.urlsafe_b64encode(deep.encode()).rstrip(b"=").decode()
    response = http.call("PUT", "/api/v1/fleet/uploads/1", None, data=b"%PDF-",
                         headers={"X-PDF-SHA256": "0" * 64, "X-PDF-Size": "5",
                                  "X-Download-Result": encoded,
                                  "Content-Type": "application/pdf"})
    assert response.status_code == 400, response.text[:300]
    err = response.json()["error"]
    assert (err["code"], err["details"]) == ("invalid_request", {"field": "X-Download-Result"})
    quiet_log()


def _source(lines: list[bytes]) -> bytes:
    import zstandard
    return zstandard.ZstdCompressor().compress(b"".join(line + b"\n" for line in lines))


def test_source_import_line(http, quiet_log):
    """Source lines keep the source import's own code for a bad line, with its line number."""
    body = _source([b'{"value": "fine"}', ("[" * 10_000 + "]" * 10_000).encode()])
    response = http.call("POST", "/api/v1/admin/projects/deep/source", None, data=body,
                         headers={"Content-Type": "application/zstd"})
    err = _refused(response, code="invalid_job")
    assert err["details"]["line"] == 2
    assert err["details"]["committed"] == 0
    assert http.counts("deep")["todo"] == 0
    quiet_log()


class HttpPages:
    """A signed-in admin over real HTTP: the session cookie made by the test client
    (sent over plain HTTP: the test server has no TLS)."""

    def __init__(self, app, live_server, monkeypatch):
        monkeypatch.setitem(app.config, "SESSION_COOKIE_SECURE", False)
        from tests.support.pages import sign_in
        client = app.test_client()
        sign_in(app, client)
        cookie = client.get_cookie(app.config.get("SESSION_COOKIE_NAME", "session"))
        self.base = live_server.url
        self.session = requests.Session()
        self.session.cookies.set(cookie.key, cookie.value, domain="127.0.0.1", path="/")
        page = self.session.get(f"{self.base}/admin/projects")
        assert page.status_code == 200, page.status_code
        self.csrf = CSRF_RE.search(page.text).group(1)

    def flash(self, path: str, data=None, files=None) -> tuple[str, str]:
        response = self.session.post(f"{self.base}{path}", data={"csrf_token": self.csrf, **(data or {})},
                                     files=files, allow_redirects=False)
        assert response.status_code == 303, (response.status_code, response.text[:500])
        page = self.session.get(f"{self.base}{response.headers['Location']}")
        flashes = FLASH_RE.findall(page.text)
        assert flashes, page.text[:1000]
        return flashes[-1]


def test_admin_jsonl_form_pasted_and_as_file(app, live_server, http, quiet_log, monkeypatch):
    pages = HttpPages(app, live_server, monkeypatch)
    category, message = pages.flash("/admin/projects/deep/enqueue/jsonl",
                                    {"jsonl": '{"value": "ok"}\n{"value": "x", "attr": {"a": ' + DEEP + "}}"})
    assert category == "error"
    assert "line 2" in message and f"deeper than {MAX_JSON_DEPTH} levels" in message
    category, message = pages.flash("/admin/projects/deep/enqueue/jsonl", {"jsonl": ""},
                                    files={"jsonl_file": ("jobs.jsonl", io.BytesIO(DEEP.encode()))})
    assert category == "error"
    assert "line 1" in message and f"deeper than {MAX_JSON_DEPTH} levels" in message
    assert http.counts("deep")["todo"] == 0
    quiet_log()


def test_admin_source_form(app, live_server, http, quiet_log, monkeypatch):
    pages = HttpPages(app, live_server, monkeypatch)
    body = _source([b'{"value": "fine"}', DEEP.encode()])
    category, message = pages.flash("/admin/projects/deep/enqueue/source",
                                    files={"source": ("jobs.jsonl.zst", io.BytesIO(body))})
    assert category == "error"
    assert f"deeper than {MAX_JSON_DEPTH} levels" in message
    quiet_log()

