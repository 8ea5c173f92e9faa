"""Small helpers for tests that speak the v1 protocol."""
from __future__ import annotations

import json

from app.api import API_CACHE_CONTROL

VERSION = "test-1"


class Api:
    """Wraps a Flask test client or a requests.Session with the usual headers."""

    def __init__(self, client, token: str, version: str | None = VERSION, base: str = ""):
        self.client = client
        self.base = base
        self.headers = {"Authorization": f"Bearer {token}"}
        if version:
            self.headers["X-Client-Version"] = version

    def call(self, method: str, path: str, body=None, **kw):
        headers = {**self.headers, **kw.pop("headers", {})}
        fn = getattr(self.client, method.lower())
        if self.base:
            return fn(self.base + path, json=body, headers=headers, **kw)
        return fn(path, json=body, headers=headers, **kw)

    def put_project(self, project_id: str, **fields):
        """Create or replace a project through FleetHQ's own route, which
        takes every FleetHQ policy field (``kind``, in-flight caps, …)."""
        fields.setdefault("client_versions", [VERSION])
        response = self.call("PUT", f"/api/v1/fleethq/projects/{project_id}", fields)
        assert response.status_code in (200, 201), _json(response)
        return _json(response)

    def enqueue(self, project_id: str, jobs: list[dict]):
        return self.call("POST", f"/api/v1/admin/projects/{project_id}/jobs", {"jobs": jobs})

    def claim(self, project_id: str, worker_id="w1", max_jobs=10, lease_seconds=60, **extra):
        return self.call("POST", f"/api/v1/projects/{project_id}/jobs/claim",
                         {"worker_id": worker_id, "max_jobs": max_jobs,
                          "lease_seconds": lease_seconds, **extra})

    def complete(self, project_id: str, jobs, worker_id="w1", kind="success"):
        items = [{"job_id": j["job_id"], "attempt_id": j["attempt_id"], "outcome": {"kind": kind}}
                 for j in jobs]
        return self.call("POST", f"/api/v1/projects/{project_id}/jobs/complete",
                         {"worker_id": worker_id, "items": items})

    def fail(self, project_id: str, jobs, retryable=True, worker_id="w1", code="network"):
        items = [{"job_id": j["job_id"], "attempt_id": j["attempt_id"], "retryable": retryable,
                  "error": {"code": code, "message": "boom"}} for j in jobs]
        return self.call("POST", f"/api/v1/projects/{project_id}/jobs/fail",
                         {"worker_id": worker_id, "items": items})

    def extend(self, project_id: str, jobs, seconds=60, worker_id="w1"):
        items = [{"job_id": j["job_id"], "attempt_id": j["attempt_id"]} for j in jobs]
        return self.call("POST", f"/api/v1/projects/{project_id}/jobs/extend-lease",
                         {"worker_id": worker_id, "extend_seconds": seconds, "items": items})

    def counts(self, project_id: str) -> dict:
        """All six job states, ``staged`` included (FleetHQ's project view)."""
        return _json(self.call("GET", f"/api/v1/fleethq/projects/{project_id}"))["job_counts"]


def _json(response):
    return response.json() if callable(getattr(response, "json", None)) else response.json


def body(response):
    return _json(response)


def values(n: int, prefix: str = "v") -> list[dict]:
    return [{"id": f"{prefix}{i}", "value": f"https://example.org/{prefix}/{i}"} for i in range(n)]


def latest_revision() -> str:
    """The newest migration, read from the revision files (named NNNN_*.py)."""
    import os
    versions = os.path.join(os.path.dirname(os.path.dirname(__file__)), "migrations", "versions")
    return max(name.split("_")[0] for name in os.listdir(versions) if name.endswith(".py"))


def db_rows(app, statement: str, **params) -> list[dict]:
    """Run one SQL statement in a session of its own, commit, return its rows."""
    from sqlalchemy import text

    from app.extensions import db
    with app.app_context():
        result = db.session.execute(text(statement), params)
        out = [dict(r) for r in result.mappings().all()] if result.returns_rows else []
        db.session.commit()
        db.session.remove()
    return out


def sql(app, statement: str, **params):
    """Run one SQL statement in a session of its own and commit; its rows as
    tuples (``None`` for a statement that returns none)."""
    from sqlalchemy import text

    from app.extensions import db
    with app.app_context():
        result = db.session.execute(text(statement), params)
        rows = result.all() if result.returns_rows else None
        db.session.commit()
        db.session.remove()
    return rows


def wait_for(predicate, timeout: float = 30.0, what: str = "the condition", interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy (returned), or fail."""
    import time

    import pytest
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def send_hints_to(monkeypatch, app, broker) -> None:
    """For this test, the test app's outbox hints go to ``broker`` (the
    queues of a real tasks process) instead of being recorded."""
    from app import outbox
    from tasks.sender import DramatiqSender
    monkeypatch.setitem(app.extensions, outbox.SENDER_KEY, DramatiqSender(broker))


def close_broker(broker) -> None:
    """Close a test's Dramatiq broker and the database pools its AppContext
    middleware opened, so no connection outlives the test."""
    from tasks.middleware import AppContext
    for middleware in broker.middleware:
        if isinstance(middleware, AppContext) and middleware._app is not None:
            from app.extensions import db
            with middleware._app.app_context():
                db.engine.dispose()
    broker.close()


ENVELOPE_KEYS = {"code", "message", "retryable", "retry_after_ms", "details"}


def api_error(response, status: int, code: str) -> dict:
    """Assert one error in the machine API's envelope; return its ``error``."""
    assert response.status_code == status, (response.status_code, response.data[:500])
    assert response.headers["Cache-Control"] == API_CACHE_CONTROL
    assert response.mimetype == "application/json"
    payload = json.loads(response.data)
    assert set(payload) == {"error"}
    err = payload["error"]
    assert set(err) == ENVELOPE_KEYS
    assert err["code"] == code
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["details"], dict)
    # Always an integer: SavewebHQ's clients decode it as int64.
    assert isinstance(err["retry_after_ms"], int) and not isinstance(err["retry_after_ms"], bool)
    if status != 429:
        assert err["retryable"] is False
        assert err["retry_after_ms"] == 0
    return err


def stop_group(proc, timeout: float = 30) -> None:
    """SIGTERM a process started with ``start_new_session=True`` and all its
    children, then SIGKILL what outlives ``timeout``."""
    import os
    import signal
    import subprocess
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
