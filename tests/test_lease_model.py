"""A model of the lease machine (DESIGN §4), driven by Hypothesis against the
real database through the real API.

Steps: enqueue, claim, complete, fail (retryable or not), extend, lease
expiry (the lease moved into the past, then the reaper), replays of finished
outcomes, stale outcomes of attempts that lost their job, admin requeues,
revocation of a worker, and the project going draining and active again.

After every step, against the model and straight in PostgreSQL: each job's
state and resets are the model's; at most one live attempt per job; a replay
is applied again and changes nothing; a stale outcome is refused and changes
nothing; the counters equal a full count.
"""
from __future__ import annotations

import itertools
import os

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from tests.helpers import Api, body, db_rows

MAX_RESETS = 1  # small, so that runs reach reset_exhausted and requeue it
WORKERS = ("w1", "w2", "w3")
_projects = itertools.count()


def _lease_machine(app, client, admin_token):
    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.api = Api(client, admin_token)
            self.project = f"model-{next(_projects)}"
            self.api.put_project(self.project, identity_mode="none", max_resets=MAX_RESETS,
                                 retry_backoff_seconds=0)
            self.status = "active"
            self.unseen = 0                 # enqueued, never claimed (ids unknown yet)
            self.jobs: dict[int, dict] = {}  # job id -> state, attempt, worker, resets
            self.finished: list[tuple] = []  # (job, attempt, worker, "done") replayable
            self.stale: list[tuple] = []     # (job, attempt, worker): lost their job
            self.revoked: set[str] = set()
            self.claimed_by: set[str] = set()
            self.values = itertools.count()

        # ------------------------------------------------------------ helpers
        def path(self, tail: str) -> str:
            return f"/api/v1/projects/{self.project}/jobs/{tail}"

        def live(self) -> list[int]:
            return sorted(j for j, m in self.jobs.items() if m["state"] == "wip")

        def todo(self) -> int:
            return self.unseen + sum(m["state"] == "todo" for m in self.jobs.values())

        def outcome(self, tail: str, job: int, attempt: str, worker: str, **fields) -> dict:
            item = {"job_id": job, "attempt_id": attempt, **fields}
            response = self.api.call("POST", self.path(tail), {"worker_id": worker, "items": [item]})
            assert response.status_code == 200, body(response)
            [result] = body(response)["results"]
            return result

        def retry_end(self, job: int) -> None:
            model = self.jobs[job]
            self.stale.append((job, model["attempt"], model["worker"]))
            model["state"] = "reset_exhausted" if model["resets"] >= MAX_RESETS else "todo"
            model["resets"] += 1
            model["attempt"] = model["worker"] = None

        # -------------------------------------------------------------- rules
        @rule(n=st.integers(1, 4))
        def enqueue(self, n):
            jobs = [{"value": f"v{next(self.values)}"} for _ in range(n)]
            response = self.api.call("POST", f"/api/v1/admin/projects/{self.project}/jobs",
                                     {"jobs": jobs})
            assert response.status_code == 200, body(response)
            self.unseen += n

        @rule(name=st.sampled_from(WORKERS), n=st.integers(1, 4))
        def claim(self, name, n):
            # Worker ids of this run only: a revocation outlives the project.
            worker = f"{self.project}-{name}"
            response = self.api.claim(self.project, worker_id=worker, max_jobs=n)
            if worker in self.revoked:
                assert response.status_code == 403, body(response)
                return
            if self.status != "active":
                assert response.status_code == 409, body(response)
                assert body(response)["error"]["code"] == "project_not_active"
                return
            assert response.status_code == 200, body(response)
            got = body(response)["jobs"]
            assert len(got) == min(n, self.todo()), (got, self.todo())
            self.claimed_by.add(worker)
            for job in got:
                job_id = job["job_id"]
                if job_id in self.jobs:
                    assert self.jobs[job_id]["state"] == "todo", (job_id, self.jobs[job_id])
                else:
                    assert self.unseen > 0
                    self.unseen -= 1
                    self.jobs[job_id] = {"resets": 0}
                self.jobs[job_id].update(state="wip", attempt=job["attempt_id"], worker=worker)

        @precondition(lambda self: self.live())
        @rule(data=st.data())
        def complete(self, data):
            job = data.draw(st.sampled_from(self.live()))
            model = self.jobs[job]
            result = self.outcome("complete", job, model["attempt"], model["worker"],
                                  outcome={"kind": "success"})
            assert (result["status"], result["job_status"]) == ("applied", "done"), result
            self.finished.append((job, model["attempt"], model["worker"]))
            model.update(state="done", attempt=None, worker=None)

        @precondition(lambda self: self.live())
        @rule(data=st.data(), retryable=st.booleans())
        def fail(self, data, retryable):
            job = data.draw(st.sampled_from(self.live()))
            model = self.jobs[job]
            result = self.outcome("fail", job, model["attempt"], model["worker"],
                                  retryable=retryable, error={"code": "network", "message": "x"})
            assert result["status"] == "applied", result
            if retryable:
                self.retry_end(job)
            else:
                self.stale.append((job, model["attempt"], model["worker"]))
                model.update(state="failed", attempt=None, worker=None)
            assert result["job_status"] == model["state"], (result, model)

        @precondition(lambda self: self.live())
        @rule(data=st.data())
        def extend(self, data):
            job = data.draw(st.sampled_from(self.live()))
            model = self.jobs[job]
            response = self.api.call("POST", self.path("extend-lease"), {
                "worker_id": model["worker"], "extend_seconds": 120,
                "items": [{"job_id": job, "attempt_id": model["attempt"]}]})
            assert response.status_code == 200, body(response)
            assert body(response)["results"][0]["status"] == "applied"

        @precondition(lambda self: self.live())
        @rule(data=st.data())
        def expire(self, data):
            job = data.draw(st.sampled_from(self.live()))
            db_rows(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                         "WHERE id = :j", j=job)
            from app.extensions import db
            from app.projects import leasing
            with app.app_context():
                assert leasing.reap_expired(self.project) == 1
                db.session.commit()
                db.session.remove()
            self.retry_end(job)

        def of_active_workers(self, outcomes) -> list[tuple]:
            return [o for o in outcomes if o[2] not in self.revoked]

        @precondition(lambda self: self.of_active_workers(self.finished))
        @rule(data=st.data())
        def replay(self, data):
            job, attempt, worker = data.draw(st.sampled_from(self.of_active_workers(self.finished)))
            before = self.rows()
            result = self.outcome("complete", job, attempt, worker, outcome={"kind": "success"})
            assert (result["status"], result["job_status"]) == ("applied", "done"), result
            assert self.rows() == before

        @precondition(lambda self: self.of_active_workers(self.stale))
        @rule(data=st.data())
        def stale_outcome(self, data):
            job, attempt, worker = data.draw(st.sampled_from(self.of_active_workers(self.stale)))
            before = self.rows()
            result = self.outcome("complete", job, attempt, worker, outcome={"kind": "success"})
            assert result["status"] != "applied", result
            assert result["error"]["code"] == "stale_attempt", result
            assert self.rows() == before

        @precondition(lambda self: any(m["state"] in ("failed", "reset_exhausted")
                                       for m in self.jobs.values()))
        @rule(data=st.data())
        def requeue(self, data):
            job = data.draw(st.sampled_from(sorted(
                j for j, m in self.jobs.items() if m["state"] in ("failed", "reset_exhausted"))))
            response = self.api.call("POST", f"/api/v1/admin/projects/{self.project}/jobs/{job}/requeue")
            assert response.status_code == 204, body(response)
            self.jobs[job].update(state="todo", resets=0)

        @precondition(lambda self: self.claimed_by - self.revoked)
        @rule(data=st.data())
        def revoke(self, data):
            worker = data.draw(st.sampled_from(sorted(self.claimed_by - self.revoked)))
            from app.extensions import db
            from app.fleet import service as fleet
            from app.projects import leasing
            with app.app_context():
                fleet.decide_token_worker("admin", worker, "revoke", end_token=False)
                leasing.cancel_worker_attempts(worker, "admin")
                db.session.commit()
                db.session.remove()
            self.revoked.add(worker)
            response = self.api.call("POST", self.path("complete"), {"worker_id": worker, "items": [
                {"job_id": 1, "attempt_id": "1", "outcome": {"kind": "success"}}]})
            assert response.status_code == 403, body(response)  # a revoked worker is refused
            for job, model in self.jobs.items():
                if model["state"] == "wip" and model["worker"] == worker:
                    # Cancelled: back to the queue at once, no reset counted.
                    self.stale.append((job, model["attempt"], worker))
                    model.update(state="todo", attempt=None, worker=None)

        @rule(status=st.sampled_from(["active", "draining"]))
        def set_status(self, status):
            self.api.put_project(self.project, identity_mode="none", max_resets=MAX_RESETS,
                                 retry_backoff_seconds=0, status=status)
            self.status = status

        # --------------------------------------------------------- invariants
        def rows(self) -> list[dict]:
            return db_rows(app, "SELECT id, state, resets, current_attempt_id FROM jobs "
                                "WHERE project_id = :p ORDER BY id", p=self.project)

        @invariant()
        def jobs_are_as_modelled(self):
            rows = {r["id"]: r for r in self.rows()}
            assert len(rows) == self.unseen + len(self.jobs)
            for job, model in self.jobs.items():
                assert (rows[job]["state"], rows[job]["resets"]) == (model["state"], model["resets"]), \
                    (job, rows[job], model)
                if model["state"] == "wip":
                    assert str(rows[job]["current_attempt_id"]) == model["attempt"]

        @invariant()
        def at_most_one_live_attempt_per_job(self):
            assert db_rows(app, "SELECT job_id FROM attempts WHERE project_id = :p "
                                "AND state IN ('running', 'uploading') GROUP BY job_id "
                                "HAVING count(*) > 1", p=self.project) == []

        @invariant()
        def counters_equal_a_full_count(self):
            full = {r["state"]: r["n"] for r in db_rows(
                app, "SELECT state, count(*) AS n FROM jobs WHERE project_id = :p GROUP BY state",
                p=self.project)}
            kept = {r["state"]: int(r["n"]) for r in db_rows(
                app, "SELECT state, sum(delta) AS n FROM job_counts WHERE project_id = :p "
                     "GROUP BY state HAVING sum(delta) <> 0", p=self.project)}
            assert kept == full

    return LeaseMachine


def test_the_lease_machine_keeps_its_invariants(app, client, admin_token):
    # make test runs a bounded, repeatable exploration; bench/model.py a
    # longer one, with fresh random choices, through these variables.
    examples = int(os.environ.get("FLEETHQ_MODEL_EXAMPLES", "25"))
    steps = int(os.environ.get("FLEETHQ_MODEL_STEPS", "40"))
    machine = _lease_machine(app, client, admin_token)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None,
        derandomize=not os.environ.get("FLEETHQ_MODEL_RANDOM"),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))
