"""Idle connections stay up past SavewebHQ's 60 s (issue "SavewebHQ's own
programs in the suite" §2). SavewebHQ's Python SDK (saveweb_hq/transport.py)
opens one ``http.client`` connection and sends every call on it, dropping it
only after an error: with gunicorn's 2-second default a worker that worked
longer than that on a job found the connection closed ("Broken pipe") and
its completion failed. This client does exactly what that transport does,
through gunicorn as deployed, with a 65-second pause between the claim and
the completion."""
from __future__ import annotations

import http.client
import json
import time

import requests

from tests.gunicorn_master import Gunicorn
from tests.helpers import VERSION, Api

PAUSE_S = 65  # longer than SavewebHQ's own idle keep-alive (60 s)


class OneConnection:
    """saveweb_hq's transport: one HTTPConnection, reused for every call."""

    def __init__(self, port: int, token: str):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                        "Cache-Control": "no-store", "Content-Type": "application/json",
                        "X-Client-Version": VERSION}

    def call(self, path: str, payload: dict) -> tuple[int, dict]:
        self.connection.request("POST", path, body=json.dumps(payload), headers=self.headers)
        response = self.connection.getresponse()
        return response.status, json.loads(response.read())


def test_a_connection_idle_longer_than_savewebhqs_keep_alive_still_serves(database_url, admin_token, tmp_path):
    # As deployed: the helper's one-connection-per-worker setting (for other
    # tests) would turn keep-alive off.
    server = Gunicorn({"DATABASE_URL": database_url, "GUNICORN_CMD_ARGS": ""}, tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        api = Api(requests.Session(), admin_token, base=server.url)
        api.put_project("slow-work")
        assert api.enqueue("slow-work", [{"id": "j1", "value": "https://example.org/1"}]).status_code == 200
        client = OneConnection(server.port, admin_token)
        status, claimed = client.call("/api/v1/projects/slow-work/jobs/claim",
                                      {"worker_id": "w1", "max_jobs": 1, "lease_seconds": 300})
        assert status == 200 and len(claimed["jobs"]) == 1
        socket_before = client.connection.sock
        assert socket_before is not None, "the master kept the connection open after its answer"
        time.sleep(PAUSE_S)  # the worker works on its job; the connection sits idle
        job = claimed["jobs"][0]
        status, done = client.call("/api/v1/projects/slow-work/jobs/complete", {
            "worker_id": "w1", "items": [{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
                                          "outcome": {"kind": "success"}}]})
        assert status == 200 and done["results"][0]["status"] == "applied", done
        assert client.connection.sock is socket_before, "the same connection served both calls"
    finally:
        server.stop()
