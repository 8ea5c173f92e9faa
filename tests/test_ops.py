"""Operations: /healthz, /readyz, /metrics, request ids, and metrics under
several gunicorn workers (DESIGN §2, app/ops)."""
from __future__ import annotations

from tests.conftest import make_app
from tests.helpers import latest_revision

import os
import re
import signal
import subprocess
import sys
import threading

import pytest
import requests

from tests.conftest import closed_port_url, free_port, unique
from tests.gunicorn_master import Gunicorn
from tests.helpers import Api, body, values, wait_for
from tests.support.metrics import (samples, value)  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAIM_ENDPOINT = "/api/v1/projects/<project_id>/jobs/claim"


def total(parsed, name: str, **labels) -> float:
    return sum(v for n, lab, v in parsed if n == name and all(lab.get(k) == x for k, x in labels.items()))


@pytest.fixture
def scratch_database(scratch_database_url):
    return scratch_database_url


def dispose(application):
    from app.extensions import db
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


# ------------------------------------------------------------------ health


def test_healthz_answers_without_a_database():
    application = make_app(closed_port_url(), check_schema=False)
    response = application.test_client().get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_app_starts_when_the_database_is_down():
    """The schema guard skips an unreachable database; /readyz reports it instead."""
    application = make_app(closed_port_url())
    assert application.test_client().get("/healthz").status_code == 200


def test_readyz_ok_when_migrated(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["status"] == "ok"
    assert response.get_json()["revision"] == [latest_revision()]


def test_readyz_503_when_database_unreachable():
    application = make_app(closed_port_url(), check_schema=False)
    response = application.test_client().get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["status"] == "unavailable"
    assert "unreachable" in response.get_json()["reason"]
    # No internals (addresses, driver messages) in the answer.
    assert "127.0.0.1" not in response.get_data(as_text=True)


def test_readyz_503_when_database_not_migrated(scratch_database):
    application = make_app(scratch_database)
    try:
        response = application.test_client().get("/readyz")
        assert response.status_code == 503
        assert response.get_json()["reason"] == "database not migrated to this release"
        assert response.get_json()["database"] == []
        assert response.get_json()["code"] == [latest_revision()]
    finally:
        dispose(application)


# ------------------------------------------------------------- request ids


def test_every_response_carries_a_request_id(client, admin_token):
    seen = set()
    responses = [
        client.get("/healthz"),
        client.get("/readyz"),
        client.get("/metrics"),
        client.get("/no/such/page"),
        client.get("/api/v1/whoami"),  # 401
        client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {admin_token}"}),
        client.delete("/healthz"),  # 405
    ]
    for response in responses:
        rid = response.headers.get("X-Request-ID")
        assert rid and re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", rid), (response.status_code, rid)
        seen.add(rid)
    assert len(seen) == len(responses)  # fresh ids, not one per process


def test_valid_incoming_request_id_is_echoed(client):
    rid = "req-42.abc:DEF_x"
    response = client.get("/healthz", headers={"X-Request-ID": rid})
    assert response.headers["X-Request-ID"] == rid
    response = client.get("/api/v1/whoami", headers={"X-Request-ID": rid})
    assert response.status_code == 401
    assert response.headers["X-Request-ID"] == rid


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon", "ü"])
def test_invalid_incoming_request_id_is_replaced(client, bad):
    response = client.get("/healthz", headers={"X-Request-ID": bad})
    rid = response.headers["X-Request-ID"]
    assert rid != bad
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", rid)


# ----------------------------------------------------------------- metrics


def _metrics(client) -> list:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    return samples(response.get_data(as_text=True))


@pytest.mark.parametrize("address, allowed", [
    ("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("203.0.113.9", False), ("10.0.0.7", False), ("2001:db8::1", False),
])
def test_metrics_answer_the_allowed_networks_only(client, address, allowed):
    """/metrics names every project and its counts: by default only this
    host reads it (FLEETHQ_METRICS_ALLOW)."""
    response = client.get("/metrics", environ_base={"REMOTE_ADDR": address})
    assert response.status_code == (200 if allowed else 403), address
    if not allowed:
        assert "FLEETHQ_METRICS_ALLOW" in response.get_data(as_text=True)
        assert "fleethq_" not in response.get_data(as_text=True)


def test_metrics_answer_a_scraper_with_the_token_from_anywhere(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "METRICS_TOKEN", "scrape-secret-1")
    monkeypatch.setitem(app.config, "METRICS_ALLOW", "192.0.2.0/24")
    outside = {"REMOTE_ADDR": "203.0.113.9"}
    assert client.get("/metrics", environ_base=outside,
                      headers={"Authorization": "Bearer scrape-secret-1"}).status_code == 200
    assert client.get("/metrics", environ_base=outside,
                      headers={"Authorization": "Bearer scrape-secret-2"}).status_code == 403
    assert client.get("/metrics", environ_base=outside).status_code == 403
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "192.0.2.44"}).status_code == 200
    # Loopback is a default, not a rule: this allow-list leaves it out.
    assert client.get("/metrics").status_code == 403


def test_a_bad_metrics_allow_list_stops_the_start():
    from app import config
    with pytest.raises(config.ConfigError, match="METRICS_ALLOW must be comma-separated networks"):
        config.load({"METRICS_ALLOW": "127.0.0.1,localhost", "DATABASE_URL": "postgresql://x/y"})


def test_metrics_count_claims_completions_failures_expiries(app, client, admin_token):
    from app.extensions import db
    from app.projects import leasing

    api = Api(client, admin_token)
    busy, idle = unique("busy"), unique("idle")
    api.put_project(busy)
    api.put_project(idle)
    api.enqueue(busy, values(6))
    api.enqueue(idle, values(2))

    claimed = body(api.claim(busy, max_jobs=4))["jobs"]
    assert len(claimed) == 4
    assert body(api.complete(busy, claimed[:1]))["results"][0]["status"] == "applied"
    assert body(api.fail(busy, claimed[1:2], retryable=True))["results"][0]["status"] == "applied"
    with app.app_context():
        db.session.execute(db.text(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :id"),
            {"id": int(claimed[2]["job_id"])})
        db.session.commit()
        assert leasing.sweep()["expired"] == 1
        db.session.remove()

    parsed = _metrics(client)
    assert value(parsed, "fleethq_claims_total", project=busy) == 4
    assert value(parsed, "fleethq_completions_total", project=busy) == 1
    assert value(parsed, "fleethq_failures_total", project=busy) == 1
    assert value(parsed, "fleethq_lease_expiries_total", project=busy) == 1
    # 2 never claimed + the retryable failure + the expired lease are waiting again.
    assert value(parsed, "fleethq_queue_depth", project=busy) == 4
    assert value(parsed, "fleethq_queue_depth", project=idle) == 2
    assert value(parsed, "fleethq_jobs", project=busy, state="wip") == 1
    assert value(parsed, "fleethq_jobs", project=busy, state="done") == 1
    assert value(parsed, "fleethq_claims_total", project=idle) in (None, 0)

    # Counters survive the fold of the delta rows.
    from app.projects import counters
    with app.app_context():
        counters.fold()
        db.session.remove()
    again = _metrics(client)
    for name in ("fleethq_claims_total", "fleethq_completions_total", "fleethq_failures_total",
                 "fleethq_lease_expiries_total", "fleethq_queue_depth"):
        assert value(again, name, project=busy) == value(parsed, name, project=busy), name

    # Re-claiming the requeued jobs counts new claims; the counter only grows.
    assert len(body(api.claim(busy, max_jobs=10))["jobs"]) == 4
    later = _metrics(client)
    assert value(later, "fleethq_claims_total", project=busy) == 8
    assert value(later, "fleethq_queue_depth", project=busy) == 0


def test_metrics_label_values_are_escaped(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("odd.name:x-1")
    api.enqueue("odd.name:x-1", values(1))
    parsed = _metrics(client)
    assert value(parsed, "fleethq_queue_depth", project="odd.name:x-1") == 1


def test_queue_depth_is_reported_for_every_project(client, admin_token):
    """An empty project is a queue of depth 0, not a missing series."""
    api = Api(client, admin_token)
    empty, drained = unique("empty"), unique("drained")
    api.put_project(empty)
    api.put_project(drained)
    api.enqueue(drained, values(1))
    job = body(api.claim(drained))["jobs"]
    api.complete(drained, job)
    parsed = _metrics(client)
    assert value(parsed, "fleethq_queue_depth", project=drained) == 0
    assert value(parsed, "fleethq_queue_depth", project=empty) == 0


def test_request_latency_histogram(client, admin_token):
    api = Api(client, admin_token)
    project = unique("lat")
    api.put_project(project)
    before = _metrics(client)
    for _ in range(3):
        assert api.claim(project).status_code == 200
    after = _metrics(client)
    name = "fleethq_http_request_duration_seconds"
    labels = {"method": "POST", "endpoint": CLAIM_ENDPOINT, "status": "200"}
    assert total(after, f"{name}_count", **labels) - total(before, f"{name}_count", **labels) == 3
    buckets = sorted(((float(lab["le"]), v) for n, lab, v in after
                      if n == f"{name}_bucket" and all(lab.get(k) == x for k, x in labels.items())))
    assert len(buckets) == 15  # 14 configured bounds + Inf
    assert buckets[-1] == (float("inf"), value(after, f"{name}_count", **labels))
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    # The endpoint label is the route rule, so project ids do not explode the label set.
    assert not any(project in lab.get("endpoint", "") for _, lab, _ in after)


# ------------------------------------------------- gunicorn, several workers


def _drive_gunicorn(server: Gunicorn, admin_token: str, project: str, idle: str) -> list:
    """60 claim requests spread over the workers; returns the parsed /metrics."""
    def post_claim(project_id, **extra):
        with requests.Session() as session:  # a new connection per request
            session.headers["Connection"] = "close"
            api = Api(session, admin_token, base=server.url)
            response = api.claim(project_id, max_jobs=1, **extra)
            assert response.status_code == 200, response.text
            return response.json()

    errors = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # Three long polls at once hold the three workers; then 57 claims, six at a time.
    threads = [threading.Thread(target=run, args=(lambda: post_claim(idle, wait_ms=1500),))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    claimed = []

    def claimer(n):
        for _ in range(n):
            claimed.extend(post_claim(project)["jobs"])

    shares = [57 // 6 + (1 if i < 57 % 6 else 0) for i in range(6)]
    assert sum(shares) == 57
    threads = [threading.Thread(target=run, args=(lambda n=n: claimer(n),)) for n in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(claimed) == 57
    assert len({j["job_id"] for j in claimed}) == 57

    response = requests.get(server.url + "/metrics", timeout=10)
    assert response.status_code == 200
    return samples(response.text)


def _check_gunicorn_metrics(parsed, project, idle):
    name = "fleethq_http_request_duration_seconds"
    assert total(parsed, f"{name}_count", endpoint=CLAIM_ENDPOINT, method="POST") == 60
    assert total(parsed, f"{name}_bucket", endpoint=CLAIM_ENDPOINT, method="POST", le="+Inf") == 60
    assert value(parsed, "fleethq_claims_total", project=project) == 57
    assert value(parsed, "fleethq_queue_depth", project=project) == 3
    assert value(parsed, "fleethq_claims_total", project=idle) in (None, 0)


def _histogram_pids(directory) -> set[str]:
    return {m.group(1) for m in (re.fullmatch(r"histogram_(\d+)\.db", n) for n in os.listdir(directory))
            if m}


@pytest.fixture
def gunicorn_project(app, client, admin_token):
    api = Api(client, admin_token)
    project, idle = unique("gun"), unique("gunidle")
    api.put_project(project)
    api.put_project(idle)
    assert body(api.enqueue(project, values(60)))["inserted"] == 60
    return project, idle


def test_metrics_under_several_gunicorn_workers(database_url, admin_token, gunicorn_project, tmp_path):
    assert os.path.exists(os.path.join(ROOT, "app", "gunicorn_conf.py"))
    project, idle = gunicorn_project
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    server = Gunicorn({"DATABASE_URL": database_url, "PROMETHEUS_MULTIPROC_DIR": str(prom_dir)},
                      tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        parsed = _drive_gunicorn(server, admin_token, project, idle)
        assert len(_histogram_pids(prom_dir)) >= 2, os.listdir(prom_dir)  # really several workers
        _check_gunicorn_metrics(parsed, project, idle)
    finally:
        server.stop()


def test_gunicorn_conf_manages_its_own_multiprocess_dir(database_url, admin_token, gunicorn_project,
                                                        tmp_path):
    """Without PROMETHEUS_MULTIPROC_DIR (the Procfile's ``web`` line) the conf makes
    one under the data dir, and a restart does not count the last run's requests again."""
    project, idle = gunicorn_project
    data_dir = tmp_path / "data"
    env = {"DATABASE_URL": database_url, "FLEETHQ_DATA_DIR": str(data_dir)}
    server = Gunicorn(env, tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        parsed = _drive_gunicorn(server, admin_token, project, idle)
        dirs = [d for d in (data_dir / "prometheus").iterdir() if d.is_dir()]
        assert len(dirs) == 1, "\n".join(map(str, os.walk(tmp_path)))
        assert len(_histogram_pids(dirs[0])) >= 2, os.listdir(dirs[0])
        _check_gunicorn_metrics(parsed, project, idle)
    finally:
        server.stop()

    server = Gunicorn(env, tmp_path / "gunicorn2.log")
    try:
        server.wait_ready()
        with requests.Session() as session:
            api = Api(session, admin_token, base=server.url)
            for _ in range(5):
                assert api.claim(idle).status_code == 200
        parsed = samples(requests.get(server.url + "/metrics", timeout=10).text)
        name = "fleethq_http_request_duration_seconds"
        assert total(parsed, f"{name}_count", endpoint=CLAIM_ENDPOINT, method="POST") == 5
        # The database-derived counters do carry over.
        assert value(parsed, "fleethq_claims_total", project=project) == 57
    finally:
        server.stop()


# ------------------------------------------------------------------ make dev, seen from another shell

def _second_shell_env(**extra) -> dict:
    """A shell beside `make dev`: nothing of FleetHQ exported."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL") and not k.startswith("FLEETHQ_")}
    return {**env, "PYTHONPATH": ROOT, **extra}


def _flask(cwd, *args, **env) -> subprocess.CompletedProcess:
    flask = os.path.join(os.path.dirname(sys.executable), "flask")
    return subprocess.run([flask, "--app", "wsgi", "fleet", *args], cwd=cwd,
                          env=_second_shell_env(**env), capture_output=True, text=True, timeout=120)


class DevStack:
    """``python -m app.dev --no-demo`` (what `make dev` runs) in its own directory."""

    def __init__(self, root):
        self.root = root
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.dev", "--no-demo"], cwd=root,
            env=_second_shell_env(FLEETHQ_PORT=str(free_port())),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.append(raw.rstrip("\n"))
            if "is ready at" in raw:
                self.ready.set()

    def wait_ready(self, timeout=240):
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            pytest.fail("make dev did not come up:\n" + "\n".join(self.lines[-40:]))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        from app.dev import embedded
        # True when make dev did not stop its PostgreSQL itself.
        self.left_postgres_running = embedded.stop_postgres(os.path.join(self.root, "var", "pg"))


@pytest.mark.slow
@pytest.mark.processes  # python -m app.dev, the whole stack
def test_host_commands_find_the_make_dev_stack_with_nothing_exported():
    import shutil
    import tempfile
    root = tempfile.mkdtemp(prefix="fhq-dev-")  # short: the Redis socket path has a limit
    state_file = os.path.join(root, "var", "devstack.json")
    try:
        stack = DevStack(root)
        try:
            _use_the_stack_from_a_second_shell(stack, root, state_file)
            _a_killed_child_is_restarted(stack)
        finally:
            stack.stop()
        assert stack.proc.returncode == 0, "\n".join(stack.lines[-40:])
        assert not stack.left_postgres_running
        assert not os.path.exists(state_file), "make dev left its state file behind"
        assert _processes_in(root) == [], "make dev left processes behind"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _processes_in(root) -> list[str]:
    """Command lines of the live processes whose working directory is ``root``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") != root:
                continue
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                found.append(fh.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def _a_killed_child_is_restarted(stack):
    """kill -9 of tasks: its dramatiq workers go with it, a new one starts, the stack stays up."""
    tasks = [p for p in _processes_in(stack.root) if "tasks:setup_broker" in p]
    assert len(tasks) >= 2, tasks          # dramatiq's main process and its worker process
    [pid] = [int(line.rsplit("pid ", 1)[1].rstrip(")")) for line in stack.lines
             if "tasks started (pid" in line]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: any("tasks restarted (pid" in line for line in stack.lines), timeout=30)
    assert any("tasks exited unexpectedly (exit -9); restarting in 1 s" in line for line in stack.lines)
    assert stack.proc.poll() is None, "make dev stopped when one child died"
    [line] = [line for line in stack.lines if "tasks restarted (pid" in line]
    new_pid = int(line.rsplit("pid ", 1)[1].rstrip(")"))
    wait_for(lambda: len([p for p in _processes_in(stack.root) if "tasks:setup_broker" in p]) >= 2,
             timeout=60)
    # Nothing of the killed child's group is left beside its successor.
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        assert int(fields[2]) != pid, f"process {p} of the killed tasks group is still alive"
    assert new_pid != pid


def _use_the_stack_from_a_second_shell(stack, root, state_file):
    import json
    import stat

    import psycopg
    stack.wait_ready()
    assert stat.S_IMODE(os.stat(state_file).st_mode) == 0o600
    with open(state_file) as fh:
        state = json.load(fh)
    assert state["pid"] == stack.proc.pid

    # The README's master-host commands, in a second shell.
    done = _flask(root, "put-project", "--project-id", "papers", "--client-versions", "my-worker-1",
                  "--dispatch-qps", "50")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["created"] is True
    done = _flask(root, "projects")
    assert done.returncode == 0, done.stderr
    assert "papers" in {p["id"] for p in json.loads(done.stdout)}
    # ... and it is the dev stack's own PostgreSQL that holds the project.
    with psycopg.connect(state["database_url"], connect_timeout=10) as conn:
        row = conn.execute("SELECT dispatch_qps, client_versions FROM projects WHERE id = 'papers'").fetchone()
    assert row == (50.0, ["my-worker-1"])

    # A token installed from the host is sealed under the stack's own key, so
    # its web processes show it again.
    token_file = os.path.join(root, "alice.token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as fh:
        fh.write("hq_carried-over-from-savewebhq\n")
    done = _flask(root, "bootstrap-user", "--user-id", "alice", "--roles", "worker",
                  "--machine-token-file", token_file)
    assert done.returncode == 0, done.stderr
    [base] = re.findall(r"is ready at (http://[0-9.:]+)/", "\n".join(stack.lines))
    with open(os.path.join(root, "var", "dev-admin.token")) as fh:
        admin_token = fh.read().strip()
    shown = requests.get(f"{base}/api/v1/admin/users/alice/machine-token", timeout=30,
                         headers={"Authorization": f"Bearer {admin_token}"})
    assert shown.status_code == 200, shown.text
    assert shown.json() == {"user_id": "alice", "token": "hq_carried-over-from-savewebhq"}


def test_config_uses_a_dev_stack_record_only_when_its_database_answers(tmp_path, monkeypatch,
                                                                     database_url, redis_url):
    from app import config
    from app.dev import state as devstate
    for name in ("DATABASE_URL", "REDIS_URL", "FLEETHQ_DATABASE_URL", "FLEETHQ_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEETHQ_DATA_DIR", str(tmp_path))
    path = devstate.write(tmp_path, database_url=database_url, redis_url=redis_url)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    cfg = config.load()
    assert (cfg["DATABASE_URL"], cfg["REDIS_URL"]) == (database_url, redis_url)
    import tasks
    broker = tasks.make_broker(config.load())  # the tasks' hints go to the same Redis
    try:
        kwargs = broker.client.connection_pool.connection_kwargs
        assert kwargs["db"] == int(redis_url.rsplit("/", 1)[1])
    finally:
        broker.close()

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/3")  # set: wins over the record
    assert config.load()["REDIS_URL"] == "redis://127.0.0.1:6379/3"
    monkeypatch.setenv("DATABASE_URL", "postgresql://elsewhere/x")  # set: the record is not read
    assert config.load()["DATABASE_URL"] == "postgresql://elsewhere/x"
    assert config.load({"DATABASE_URL": "postgresql://given/y"})["DATABASE_URL"] == "postgresql://given/y"
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.delenv("REDIS_URL")

    # A stack killed hard leaves its record; once its server is gone it is ignored.
    devstate.write(tmp_path, database_url=closed_port_url(), redis_url=redis_url)
    cfg = config.load()
    assert (cfg["DATABASE_URL"], cfg["REDIS_URL"]) == (config.Defaults.DATABASE_URL,
                                                      config.Defaults.REDIS_URL)
    devstate.remove(tmp_path)
    assert not path.exists()


def test_a_stack_removes_only_its_own_record(tmp_path):
    import json

    from app.dev import state as devstate
    path = tmp_path / devstate.STATE_FILE
    path.write_text(json.dumps({"pid": os.getpid() + 1, "database_url": "postgresql://x/y"}))
    devstate.remove(tmp_path)  # another stack's record: kept
    assert path.exists()


def test_spool_fill_is_a_gauge_against_its_quota(app, client, monkeypatch):
    """A full spool answers uploads with 507: it must be seen coming."""
    from app.extensions import db
    from app.uploads import spool
    monkeypatch.setitem(app.config, "SPOOL_MAX_BYTES", 1000)
    assert value(_metrics(client), "fleethq_spool_reserved_bytes") == 0
    assert value(_metrics(client), "fleethq_spool_max_bytes") == 1000
    with app.app_context():
        spool.reserve(spool.Spool.from_config(app.config), 700)
        db.session.commit()
        with pytest.raises(spool.SpoolFull):
            spool.reserve(spool.Spool.from_config(app.config), 301)
        db.session.rollback()
        db.session.remove()
    assert value(_metrics(client), "fleethq_spool_reserved_bytes") == 700


def test_local_worker_finds_the_make_dev_stack_it_runs_beside(tmp_path, monkeypatch):
    """``flask fleet local-worker`` without FLEETHQ_BIND aims at the web
    address the make dev stack of its data directory recorded (FLEETHQ_PORT),
    not 8400; with no live stack there, at 8400."""
    import socket

    from app.dev import state as devstate
    from app.cli.lanes import _default_master_url
    monkeypatch.delenv("FLEETHQ_BIND", raising=False)
    monkeypatch.delenv("PORT", raising=False)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        devstate.write(tmp_path, database_url="postgresql://127.0.0.1:1/x", redis_url="redis://127.0.0.1:1",
                       web_url=f"http://127.0.0.1:{port}")
        assert _default_master_url(str(tmp_path)) == f"http://127.0.0.1:{port}"
    assert _default_master_url(str(tmp_path)) == "http://127.0.0.1:8400"  # nothing answers there now
    monkeypatch.setenv("FLEETHQ_BIND", "0.0.0.0:9123")
    assert _default_master_url(str(tmp_path)) == "http://127.0.0.1:9123"


def test_local_worker_prepare_only_makes_its_node_and_identity_and_exits(app, tmp_path):
    """``--prepare-only``: what compose's one-shot fetcher-node runs (with
    the database) so that the fetcher itself (without it) only runs the
    worker program on the volume."""
    import json

    from tests.helpers import sql
    runner = app.test_cli_runner()
    args = ["fleet", "local-worker", "--volume", str(tmp_path / "fetcher"), "--master-url",
            "http://web:8400", "--tier", "first", "--prepare-only"]
    first = runner.invoke(args=args)
    assert first.exit_code == 0, first.output
    node = json.loads(first.output)
    assert node["created"] is True and node["master"] == "http://web:8400"
    identity = json.loads((tmp_path / "fetcher" / "identity.json").read_text())
    assert identity["worker_id"] == node["worker_id"] and identity["registered"] is True
    assert sql(app, "SELECT status, tier, local FROM fleet_nodes WHERE id = :i", i=node["worker_id"]) \
        == [("active", "first", True)]
    again = runner.invoke(args=args)
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["worker_id"] == node["worker_id"]
    assert json.loads(again.output)["created"] is False
