"""Idle connections stay up past SavewebHQ's 60 s (issue "SavewebHQ's own
programs in the suite" §2). SavewebHQ's Python SDK (saveweb_hq/transport.py)
opens one ``http.client`` connection and sends every call on it, dropping it
only after an error: with gunicorn's 2-second default a worker that worked
longer than that on a job found the connection closed ("Broken pipe") and
its completion failed. Here the SDK itself, unchanged, talks to gunicorn as
deployed, with a 65-second pause between the claim and the completion."""
from __future__ import annotations

import time

from tests.gunicorn_master import Gunicorn
from tests.savewebhq_programs import CLIENT_VERSION, one_job_project, python_sdk

PAUSE_S = 65  # longer than SavewebHQ's own idle keep-alive (60 s)


def test_a_connection_idle_longer_than_savewebhqs_keep_alive_still_serves(app, database_url, tmp_path):
    sdk = python_sdk()
    # As deployed: the helper's one-connection-per-worker setting (for other
    # tests) would turn keep-alive off.
    server = Gunicorn({"DATABASE_URL": database_url, "GUNICORN_CMD_ARGS": ""}, tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        worker = one_job_project(app, server.url, tmp_path, "slow-work")
        config = sdk.Config(server.url, worker, CLIENT_VERSION, allow_http_tracker=True)
        with sdk.open_project_queue(config, "slow-work") as queue:
            job = queue.claim(max_jobs=1)["jobs"][0]
            connection = queue._tracker._connection
            assert connection is not None and connection.sock is not None, \
                "the master kept the connection open after its answer"
            socket_before = connection.sock
            time.sleep(PAUSE_S)  # the worker works on its job; the connection sits idle
            done = queue.complete([{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
                                    "outcome": {"kind": "success", "code": 200, "uri": None, "meta": {}},
                                    "artifact_receipts": []}])
            assert done["results"][0]["status"] == "applied", done
            assert queue._tracker._connection is connection and connection.sock is socket_before, \
                "the same connection served both calls"
    finally:
        server.stop()
