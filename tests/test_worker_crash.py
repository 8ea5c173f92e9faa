"""kill -9 of fleethq-worker during a download and during an upload: after a
restart on the same volume every job ends archived exactly once (one done
upload, one asset) and no file is left on the volume."""
from __future__ import annotations

import time

from tests.publisher import Publisher
from tests.worker_harness import (archiver, fleet, master, publisher, sql,  # noqa: F401
                                       wait_for)


def attempts_per_job(app, project: str) -> dict[str, int]:
    rows = sql(app, "SELECT j.value, count(a.id) AS n FROM jobs j JOIN attempts a ON a.job_id = j.id "
                    "WHERE j.project_id = :p GROUP BY j.value", p=project)
    return {r["value"]: r["n"] for r in rows}


def test_kill_during_download_resumes_the_same_attempts(fleet, publisher):
    # Slow papers: the publisher answers after 3 s, so the kill lands mid-download.
    values = [f"{publisher.url}/slow/{n}?delay=3" for n in range(1, 5)]
    project = fleet.project()
    fleet.enqueue(project, values)
    worker = fleet.worker(project)
    wait_for(lambda: worker.states().get("downloading") == 2, 30,
             f"two downloads in flight: {worker.states()}\n{worker.output()}")
    time.sleep(0.5)
    worker.kill9()
    held = [e["attempt_id"] for e in worker.journal().values() if e["state"] == "downloading"]
    assert len(held) == 2 and worker.states() == {"downloading": 2}

    worker.start()  # same volume: no enrollment, no approval needed
    counts = fleet.wait_settled(project, len(values), timeout=90, proc=worker)
    assert counts["done"] == len(values), worker.output()[-4000:]
    fleet.archived_once(project)
    # The interrupted downloads were fetched again under the attempts the
    # master still leased: no new attempt, no retry counted against the job.
    assert attempts_per_job(fleet.app, project) == {v: 1 for v in values}
    done = {r["attempt_id"] for r in sql(fleet.app, "SELECT attempt_id::text FROM uploads "
                                                    "WHERE state = 'done' AND project_id = :p", p=project)}
    assert set(held) <= done
    assert "download resumed after restart" in worker.output()
    wait_for(lambda: worker.files() == [], 15, f"an empty volume: {worker.files()}")
    assert worker.terminate() == 0


def test_kill_during_upload_retries_the_same_attempt(fleet, master):
    # 16 MiB papers read slowly by the master (~13 s each): far more than the
    # socket buffers hold, so the kill surely cuts the body short.
    with Publisher(paper_bytes=16 << 20) as big:
        values = [p.value for p in big.papers(3)]
        project = fleet.project()
        fleet.enqueue(project, values)
        master.upload_delay_s = 0.05
        worker = fleet.worker(project)
        assert master.upload_started.wait(60), worker.output()
        time.sleep(1.0)
        worker.kill9()
        _after_kill(fleet, master, worker, project, values)


def _after_kill(fleet, master, worker, project, values):
    master.upload_delay_s = 0.0
    ready = [e for e in worker.journal().values() if e["state"] == "ready"]
    assert ready, worker.states()
    interrupted = sql(fleet.app, "SELECT attempt_id::text FROM uploads WHERE state = 'uploading' "
                                 "AND project_id = :p", p=project)
    assert interrupted, "the kill should have cut an upload short"

    worker.start()
    counts = fleet.wait_settled(project, len(values), timeout=90, proc=worker)
    assert counts["done"] == len(values), worker.output()[-4000:]
    fleet.archived_once(project)
    # The cut upload was sent again for the same attempt (a new generation).
    for row in interrupted:
        upload = sql(fleet.app, "SELECT state, generation FROM uploads WHERE attempt_id = :a",
                     a=int(row["attempt_id"]))[0]
        assert upload["state"] == "done" and upload["generation"] >= 2, upload
    assert attempts_per_job(fleet.app, project) == {v: 1 for v in values}
    wait_for(lambda: worker.files() == [], 15, f"an empty volume: {worker.files()}")
    assert worker.terminate() == 0
