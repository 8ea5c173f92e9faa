"""The test master for the fleethq-worker tests (no tests here): the test app
behind a werkzeug server on a fixed port, so that it can be stopped and
started again at the same URL (an outage), with a gate in front that can
slow down or refuse uploads and lose registration answers.
"""
from __future__ import annotations

import json
import threading
import time

from werkzeug.serving import WSGIRequestHandler, make_server

from tests.conftest import free_port


class Master:
    """The test app on 127.0.0.1:<port>; stop() and start() keep the URL.

    As a WSGI app it wraps the test app: tests may slow down or refuse
    uploads and lose registration answers through the attributes below."""

    def __init__(self, app):
        self.app, self.port, self._server = app, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.upload_delay_s = 0.0                 # per 64 KiB read of an upload body
        self.refuse_uploads: tuple | None = None  # (status, code): answer uploads so
        self.upload_started = threading.Event()
        self.lose_register_answers = 0            # register, then answer 502 instead of 201
        self.older_heartbeats = False             # refuse a heartbeat's projects, as before 0018
        self.heartbeats_with_projects = 0

    def __call__(self, environ, start_response):
        if environ["PATH_INFO"] == "/api/v1/fleet/heartbeat":
            import io
            raw = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(raw)
            if "projects" in json.loads(raw or b"{}"):
                self.heartbeats_with_projects += 1
                if self.older_heartbeats:
                    body = json.dumps({"error": {
                        "code": "invalid_request", "message": "projects: unknown field",
                        "retryable": False, "retry_after_ms": 0, "details": {"field": "projects"}}}).encode()
                    start_response("400 Bad Request", [("Content-Type", "application/json"),
                                                       ("Content-Length", str(len(body)))])
                    return [body]
        if self.lose_register_answers and environ["PATH_INFO"] == "/api/v1/fleet/register":
            self.lose_register_answers -= 1
            list(self.app(environ, lambda *a, **k: None))   # the master registers the node...
            start_response("502 Bad Gateway", [("Content-Length", "0")])
            return [b""]                                     # ...but the answer is lost
        if environ["REQUEST_METHOD"] == "PUT" and environ["PATH_INFO"].startswith("/api/v1/fleet/uploads/"):
            self.upload_started.set()
            if self.refuse_uploads:
                status, code = self.refuse_uploads
                body = json.dumps({"error": {"code": code, "message": f"test: {code}",
                                             "retryable": status >= 500, "retry_after_ms": 1000,
                                             "details": {}}}).encode()
                start_response(f"{status} Refused", [
                    ("Content-Type", "application/json"), ("Retry-After", "1"),
                    ("Content-Length", str(len(body))), ("Cache-Control", "no-store")])
                return [body]
            if self.upload_delay_s:
                environ["wsgi.input"] = _Slow(environ["wsgi.input"], self.upload_delay_s)
        return self.app(environ, start_response)

    def start(self) -> "Master":
        self._server = make_server("127.0.0.1", self.port, self, threaded=True,
                                   request_handler=_Quiet)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Quiet(WSGIRequestHandler):
    # No access log: long-polls still running when a test ends would log into
    # pytest's closed capture streams.
    def log(self, *args, **kwargs):
        pass


class _Slow:
    def __init__(self, stream, delay: float):
        self._stream, self._delay = stream, delay

    def read(self, n=-1):
        time.sleep(self._delay)
        return self._stream.read(min(n, 64 * 1024) if n and n > 0 else 64 * 1024)

    def readline(self, *args):
        return self._stream.readline(*args)
