"""Helpers for fleet and upload tests: enrolled nodes speaking the protocol.

Works with a Flask test client (``base=""``) or with a ``requests.Session``
against a live server (``base=url``).
"""
from __future__ import annotations

import base64
import hashlib
import secrets

from tests.helpers import VERSION, body
from workers.runner.volume import new_worker_id


def new_identity() -> tuple[str, str]:
    node_id = new_worker_id()
    secret = "fhqn_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    return node_id, secret


def enrollment_credential(app) -> str:
    from app.extensions import db
    from app.fleet import service as fleet
    with app.app_context():
        credential = fleet.create_enrollment("test")
        db.session.remove()
    return credential


def decide(app, node_id: str, action: str) -> str:
    from app.extensions import db
    from app.fleet import service as fleet
    with app.app_context():
        status = fleet.decide(node_id, action, actor="test").status
        db.session.remove()
    return status


class Node:
    def __init__(self, client, app, *, base: str = "", name: str = "node", approve: bool = True):
        self.client, self.base = client, base
        self.node_id, self.secret = new_identity()
        credential = enrollment_credential(app)
        response = self._call("POST", "/api/v1/fleet/register", json={
            "id": self.node_id, "name": name, "enrollment_token": credential, "secret": self.secret},
            auth=False)
        assert response.status_code == 201, body(response)
        if approve:
            decide(app, self.node_id, "approve")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.secret}", "X-Client-Version": VERSION}

    def _call(self, method, path, *, auth=True, headers=None, **kw):
        all_headers = {**(self.headers if auth else {}), **(headers or {})}
        fn = getattr(self.client, method.lower())
        return fn(self.base + path, headers=all_headers, **kw)

    def heartbeat(self, running=(), **extra):
        payload = {"capacity": 2, "browser_ok": True, "disk_free_bytes": 10**11, "spool_bytes": 0,
                   "running_attempt_ids": list(running), **extra}
        return self._call("POST", "/api/v1/fleet/heartbeat", json=payload)

    def claim(self, project_id: str, max_jobs: int = 1, lease_seconds: int = 60, **extra):
        return self._call("POST", f"/api/v1/projects/{project_id}/jobs/claim", json={
            "worker_id": self.node_id, "max_jobs": max_jobs, "lease_seconds": lease_seconds, **extra})

    def fail(self, project_id: str, job, retryable=True, code="network"):
        return self._call("POST", f"/api/v1/projects/{project_id}/jobs/fail", json={
            "worker_id": self.node_id, "items": [{
                "job_id": job["job_id"], "attempt_id": job["attempt_id"], "retryable": retryable,
                "error": {"code": code, "message": "test"}}]})

    def upload(self, attempt_id: str, data: bytes, *, sha256: str | None = None,
               size: int | None = None, headers=None):
        digest = sha256 or hashlib.sha256(data).hexdigest()
        return self._call("PUT", f"/api/v1/fleet/uploads/{attempt_id}", data=data, headers={
            "X-PDF-SHA256": digest, "X-PDF-Size": str(len(data) if size is None else size),
            "Content-Type": "application/pdf", **(headers or {})})

    def receipt(self, attempt_id: str, wait_ms: int = 0):
        return self._call("GET", f"/api/v1/fleet/receipts/{attempt_id}?wait_ms={wait_ms}")


def pdf_project(api, project_id: str = "papers", **fields):
    fields.setdefault("kind", "pdf")
    fields.setdefault("identity_mode", "unique_value")
    return api.put_project(project_id, **fields)


def papers(n: int, prefix: str = "10.1234/paper") -> list[dict]:
    return [{"value": f"{prefix}{i}"} for i in range(n)]
