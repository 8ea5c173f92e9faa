"""The process commands of ``Procfile`` and ``docker-compose.yml``, run as a
platform runs them: each as a real subprocess from the application root,
with the environment compose gives it (PostgreSQL, Redis, S3 staging on a
moto server), checked to start, do its work and stop cleanly on SIGTERM.

The commands are read from the two files, so a change to either that no
longer starts, serves or stops fails here.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import redis
import requests
import yaml

from tests import scans
from tests.conftest import free_port, unique
from tests.fleet_helpers import pdf_project
from tests.helpers import Api, body, db_rows, latest_revision, sql, values, wait_for
from tests.support.archive import MotoServer, s3_client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
# gunicorn_conf's graceful_timeout: in-flight long polls may take this long.
GRACEFUL_TIMEOUT_S = 35
# `docker stop` (and most platforms) send SIGKILL this long after SIGTERM.
STOP_GRACE_S = 10


def _procfile() -> dict[str, list[str]]:
    commands = {}
    with open(os.path.join(ROOT, "Procfile"), encoding="utf-8") as fh:
        for line in fh:
            if line.strip() and not line.lstrip().startswith("#"):
                name, command = line.split(":", 1)
                commands[name.strip()] = shlex.split(command)
    return commands


def _compose() -> dict:
    with open(os.path.join(ROOT, "docker-compose.yml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


PROCFILE = _procfile()
COMPOSE = _compose()
# Procfile process type -> compose service running it.
# The Procfile's fetcher is two services in compose: fetcher-node runs its
# command up to --prepare-only (with the master's settings), fetcher the
# worker program it would then become (without them).
SERVICES = {"release": "migrate", "web": "web", "tasks": "tasks", "fetcher": "fetcher-node", "consume": "consume"}
# A clock of its own, besides the one each tasks process runs: the command
# docs/deployment.md gives for a standby (or for FLEETHQ_TASKS_CLOCK=false).
CLOCK = ["python", "-m", "tasks.clock"]
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


def compose_command(service: str) -> list[str]:
    return list(COMPOSE["services"][service]["command"])


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _with_option(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


def compose_env(service: str, **local) -> dict:
    """The environment compose gives ``service``, with the host-specific values
    (addresses, secrets, directories) replaced by ``local``. Fails when ``local``
    names a variable compose does not set, or compose requires one (``${X:?}``)
    that ``local`` does not give: the test then no longer runs compose's shape."""
    declared = COMPOSE["services"][service].get("environment") or {}
    unknown = set(local) - set(declared)
    assert not unknown, f"compose's {service} service sets none of {sorted(unknown)}"
    env = {}
    for key, raw in declared.items():
        if key in local:
            env[key] = local[key]
            continue

        def resolve(match, key=key, raw=raw):
            assert match.group(2) == "-", f"compose requires {key} ({raw!r}): give it a test value"
            return match.group(3)
        env[key] = _INTERPOLATION.sub(resolve, str(raw))
    return env


def _base_env() -> dict:
    """A host environment with nothing of FleetHQ in it, the virtualenv first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLEETHQ_", "S3_"))
           and k not in ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR", "PORT",
                         "WEB_CONCURRENCY", "GUNICORN_CMD_ARGS", "PYTHONPATH")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ------------------------------------------------------------------ processes


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, process group, state) of a live process, None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[2]), fields[0]


def related(pid: int) -> set[int]:
    """Live processes of ``pid``'s group or with it as parent (zombies excluded):
    what a clean stop must not leave behind."""
    found = set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        other = int(name)
        info = _stat(other)
        if other != pid and info and info[2] != "Z" and pid in (info[0], info[1]):
            found.add(other)
    return found


def _alive(pids) -> set[int]:
    return {p for p in pids if (info := _stat(p)) and info[2] != "Z"}


class Service:
    """One command as a platform starts it: resolved on PATH, run from the
    application root in a session of its own (its group id is its pid)."""

    def __init__(self, argv: list[str], env: dict, log_path):
        exe = shutil.which(argv[0], path=env["PATH"])
        assert exe, f"{argv[0]!r} is not on PATH ({env['PATH']})"
        self.argv, self.log_path = argv, log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([exe, *argv[1:]], cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def assert_running(self):
        assert self.proc.poll() is None, (
            f"`{shlex.join(self.argv)}` exited with {self.proc.returncode}:\n{self.log()}")

    def stop(self, timeout: float) -> tuple[int, float, set[int]]:
        """SIGTERM; (exit code, seconds to exit, processes it had that are still
        alive a moment later). Fails if it does not exit within ``timeout``."""
        children = related(self.pid)
        self.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{shlex.join(self.argv)}` still running {timeout} s after SIGTERM:\n{self.log()}")
        took = time.monotonic() - started
        # Orphans are re-parented, not killed: give a clean exit's children a
        # moment, then whatever is left of them (or of the group) is a leak.
        left = children | related(self.pid)
        deadline = time.monotonic() + 2
        while _alive(left) and time.monotonic() < deadline:
            time.sleep(0.05)
        return code, took, _alive(left) | related(self.pid)

    def kill(self):
        """Whatever is left of the process and its group, for teardown."""
        for pid in {self.pid, *related(self.pid)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


@pytest.fixture
def spawn(tmp_path):
    """Start a command (argv, env, log name); every one is killed at teardown."""
    started: list[Service] = []

    def start(argv, env, name) -> Service:
        service = Service(argv, {**_base_env(), **env}, tmp_path / f"{name}.log")
        started.append(service)
        return service
    yield start
    for service in started:
        service.kill()


def assert_clean_stop(service: Service, timeout: float) -> float:
    code, took, left = service.stop(timeout)
    assert code == 0, f"`{shlex.join(service.argv)}` exited {code} on SIGTERM:\n{service.log()}"
    assert not left, f"`{shlex.join(service.argv)}` left processes {sorted(left)} behind"
    return took


# ------------------------------------------------------------------ services


@pytest.fixture(scope="module")
def s3():
    """The compose shape stages uploads in S3: moto over HTTP, with a bucket
    (compose's minio-bucket step creates it)."""
    server = MotoServer()
    server.start()
    bucket = f"procs-{uuid.uuid4().hex[:12]}"
    s3_client(server.url).create_bucket(Bucket=bucket)
    yield {"S3_ENDPOINT_URL": server.url, "S3_BUCKET": bucket}
    server.stop()


def drop_queues(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        stale = client.keys("dramatiq:*")
        if stale:
            client.delete(*stale)
    finally:
        client.close()


@pytest.fixture(scope="module")
def process_redis_url(redis_url):
    """A Redis database of the processes' own, next to the suite's: their
    queues must not mix with what other tests send."""
    base, number = redis_url.rsplit("/", 1)
    url = f"{base}/{int(number) - 1 if int(number) > 0 else 1}"
    drop_queues(url)
    yield url
    drop_queues(url)


@pytest.fixture(scope="module")
def master_env(app, database_url, process_redis_url, s3, tmp_path_factory):
    """Compose's master environment for one service, the data dir per process.
    ``app`` migrates the session database: compose starts the master's
    processes once its migrate step has completed."""
    root = tmp_path_factory.mktemp("procs")
    # As compose mounts it: the key in a file of its own, mode 0600.
    secret = root / "fleethq_secret_key"
    secret.write_text(uuid.uuid4().hex * 2 + "\n")
    secret.chmod(0o600)

    def env(service: str, **extra) -> dict:
        return compose_env(service, **{
            "DATABASE_URL": database_url, "REDIS_URL": process_redis_url,
            "FLEETHQ_SECRET_KEY_FILE": str(secret),
            "FLEETHQ_DATA_DIR": str(root / f"data-{service}-{uuid.uuid4().hex[:6]}"),
            **s3, **extra})
    return env


def web_env(master_env, tmp_path, port: int) -> dict:
    prom = tmp_path / f"prometheus-{port}"  # compose: a tmpfs, empty at every start
    prom.mkdir()
    return master_env("web", FLEETHQ_BIND=f"127.0.0.1:{port}", PROMETHEUS_MULTIPROC_DIR=str(prom))


def wait_ready(service: Service, url: str, timeout: float = 60) -> dict:
    def ready():
        service.assert_running()
        try:
            response = requests.get(url + "/readyz", timeout=3)
        except requests.RequestException:
            return None
        return response.status_code == 200 and response.json()
    return wait_for(ready, timeout=timeout, what=f"{url}/readyz to answer 200", interval=0.2)


def listening_on_all_interfaces(port: int) -> bool:
    """A TCP socket listening on 0.0.0.0:port (/proc/net/tcp, state 0A = LISTEN)."""
    with open("/proc/net/tcp", encoding="ascii") as fh:
        for line in fh.readlines()[1:]:
            local, _remote, state = line.split()[1:4]
            if local == f"00000000:{port:04X}" and state == "0A":
                return True
    return False


# ------------------------------------------------------------------ the files


def test_compose_runs_the_procfile_commands():
    assert set(PROCFILE) == set(SERVICES), PROCFILE
    for process, service in SERVICES.items():
        command = compose_command(service)
        assert command[:len(PROCFILE[process])] == PROCFILE[process], (process, command)
    # What compose adds: the fetcher's volume and master, the same for both steps.
    assert compose_command("tasks") == PROCFILE["tasks"]
    node, fetcher = compose_command("fetcher-node"), compose_command("fetcher")
    assert "--prepare-only" in node
    web_port = COMPOSE["services"]["web"]["environment"]["FLEETHQ_BIND"].rsplit(":", 1)[1]
    assert _option(node, "--master-url") == _option(fetcher, "--master") == f"http://web:{web_port}"
    assert fetcher[:4] == ["python", "-m", "workers.runner.cli", "run"]  # the worker program alone
    for service, argv in (("fetcher-node", node), ("fetcher", fetcher)):
        mounts = {v.split(":")[1] for v in COMPOSE["services"][service]["volumes"]}
        assert _option(argv, "--volume") in mounts
    assert COMPOSE["services"]["fetcher-node"]["volumes"] == COMPOSE["services"]["fetcher"]["volumes"]


# ------------------------------------------------------------------ release


def test_release_migrates_a_fresh_database_and_again_a_migrated_one(scratch_database_url,
                                                                   master_env):
    env = {**_base_env(), **master_env("migrate", DATABASE_URL=scratch_database_url)}
    for run in ("fresh", "again"):
        done = subprocess.run(PROCFILE["release"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"release ({run}) exited {done.returncode}:\n{done.stderr[-4000:]}"
        with psycopg.connect(scratch_database_url) as conn:
            revisions = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
            assert revisions == [latest_revision()], (run, revisions)
            assert conn.execute("SELECT to_regclass('fleet_nodes') IS NOT NULL").fetchone()[0]


# ------------------------------------------------------------------ web


@pytest.fixture(scope="module")
def web(master_env, tmp_path_factory):
    """The Procfile's web line on FLEETHQ_BIND for the module: the fetcher
    tests talk to it, the module's last test stops it."""
    tmp = tmp_path_factory.mktemp("web")
    port = free_port()
    service = Service(PROCFILE["web"], {**_base_env(), **web_env(master_env, tmp, port)},
                      tmp / "web.log")
    service.url = f"http://127.0.0.1:{port}"
    yield service
    service.kill()


def test_web_answers_readyz_on_fleethq_bind(web):
    ready = wait_ready(web, web.url)
    assert ready["status"] == "ok" and ready["revision"] == [latest_revision()]
    workers = related(web.pid)
    assert len(workers) == 2, f"gunicorn runs {len(workers)} worker(s), not the default 2:\n{web.log()}"


def test_web_binds_every_interface_on_port_without_fleethq_bind(spawn, master_env, tmp_path):
    """The Procfile platforms' convention: they say where to listen with PORT
    (and how many processes with WEB_CONCURRENCY)."""
    port = free_port()
    env = web_env(master_env, tmp_path, port)
    del env["FLEETHQ_BIND"]
    web = spawn(PROCFILE["web"], {**env, "PORT": str(port), "WEB_CONCURRENCY": "1"}, "web-port")
    wait_ready(web, f"http://127.0.0.1:{port}")
    assert listening_on_all_interfaces(port), f"not listening on 0.0.0.0:{port}:\n{web.log()}"
    assert len(related(web.pid)) == 1, web.log()
    assert_clean_stop(web, GRACEFUL_TIMEOUT_S + 5)


# ------------------------------------------------------------------ fetcher


@pytest.mark.parametrize("source", ["procfile", "compose"])
def test_fetcher_creates_its_node_against_web_and_stops_cleanly(
        source, spawn, web, master_env, app, client, admin_token, tmp_path):
    from workers.runner.settings import default_client_version
    # What compose gives the process that downloads: no master setting at all.
    worker_env = compose_env("fetcher")
    # The project compose names, open to this worker program: the fetcher
    # then sits in its idle steady state, a long-polling claim.
    pdf_project(Api(client, admin_token), worker_env["FLEETHQ_PROJECTS"],
                client_versions=[default_client_version()])
    wait_ready(web, web.url)
    if source == "compose":
        volume = tmp_path / "fetcher"
        prepare = _with_option(_with_option(compose_command("fetcher-node"), "--volume", str(volume)),
                               "--master-url", web.url)
        done = subprocess.run(prepare, cwd=ROOT, env={**_base_env(), **master_env("fetcher-node")},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-4000:]
        argv = _with_option(_with_option(compose_command("fetcher"), "--volume", str(volume)),
                            "--master", web.url)
        env = worker_env
    else:
        # The Procfile line has no flags: the volume is under the data dir and
        # the master is at FLEETHQ_BIND's port, which a Procfile platform
        # gives every process alike.
        argv = PROCFILE["fetcher"]
        env = {**master_env("fetcher-node"), "FLEETHQ_PROJECTS": worker_env["FLEETHQ_PROJECTS"]}
        volume = Path(env["FLEETHQ_DATA_DIR"]) / "fetcher"
        env["FLEETHQ_BIND"] = web.url.removeprefix("http://")
    fetcher = spawn(argv, env, f"fetcher-{source}")

    def heartbeating():
        fetcher.assert_running()
        return db_rows(app, "SELECT id, status, local, tier FROM fleet_nodes "
                            "WHERE last_heartbeat_at IS NOT NULL")
    [node] = wait_for(heartbeating, timeout=45, what="the fetcher's node to heartbeat to web")
    assert (node["status"], node["local"], node["tier"]) == ("active", True, "auto"), node
    assert json.loads((volume / "identity.json").read_text())["worker_id"] == node["id"]
    # docs/worker.md: 0 is "stopped by SIGTERM/SIGINT".
    assert_clean_stop(fetcher, STOP_GRACE_S)
    assert "stopped;" in fetcher.log(), fetcher.log()
    assert "claim from" not in fetcher.log(), fetcher.log()  # no claim refused or failed


# ------------------------------------------------------------------ tasks


def _expired_lease(app, client, admin_token) -> int:
    """A claimed job whose lease ran out: the next reap_leases puts it back."""
    api = Api(client, admin_token)
    project = unique("procs")
    api.put_project(project)
    assert body(api.enqueue(project, values(1)))["inserted"] == 1
    [job] = body(api.claim(project))["jobs"]
    sql(app, "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :id",
        id=int(job["job_id"]))
    return int(job["job_id"])


def _send(redis_url: str, queue: str, actor: str) -> None:
    """Enqueue a message as the web and the clock do, through a broker of our own."""
    import dramatiq

    from tasks import PromptRedisBroker
    broker = PromptRedisBroker(url=redis_url)
    try:
        broker.enqueue(dramatiq.Message(queue_name=queue, actor_name=actor, args=(), kwargs={},
                                        options={}))
    finally:
        broker.close()


@pytest.mark.parametrize("source", ["procfile", "compose"])
def test_tasks_processes_a_message_runs_the_clock_and_stops_cleanly(source, spawn, master_env, app, client,
                                                                    admin_token, process_redis_url,
                                                                    database_url):
    from tasks import actors
    argv = PROCFILE["tasks"] if source == "procfile" else compose_command("tasks")
    job_id = _expired_lease(app, client, admin_token)
    tasks = spawn(argv, master_env("tasks"), f"tasks-{source}")
    # Sent before the workers are up: the message waits in Redis for them.
    _send(process_redis_url, actors.reap_leases.queue_name, actors.reap_leases.actor_name)

    def requeued():
        tasks.assert_running()
        return db_rows(app, "SELECT state FROM jobs WHERE id = :id", id=job_id)[0]["state"] == "todo"
    wait_for(requeued, timeout=45, what="the tasks process to reap the expired lease")
    workers = related(tasks.pid)
    assert workers, "dramatiq runs no worker process"
    # The shape's only clock: a thread of the tasks process, which leads and
    # hands the lease back when the process stops.
    wait_for(lambda: "clock leading" in tasks.log() or tasks.assert_running(), timeout=30,
             what=f"the tasks process's clock to lead\n{tasks.log()}")
    assert [held for _pid, held in _clock_sessions(database_url)] == [1]
    assert_clean_stop(tasks, STOP_GRACE_S)
    wait_for(lambda: not _clock_sessions(database_url), timeout=5,
             what="the clock's lease session to end")


# ------------------------------------------------------------------ clock


def _clock_sessions(database_url: str) -> list[tuple]:
    """(backend pid, advisory locks held) of the clock's sessions on this database."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT a.pid, count(l.*) FILTER (WHERE l.locktype = 'advisory' AND l.granted) "
            "FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid "
            "WHERE a.application_name = 'fleethq-clock' AND a.datname = current_database() "
            "GROUP BY a.pid").fetchall()


def _queued_actors(redis_url: str, queue: str) -> set[str]:
    client = redis.Redis.from_url(redis_url)
    try:
        return {json.loads(raw)["actor_name"] for raw in client.hvals(f"dramatiq:{queue}.msgs")}
    finally:
        client.close()


def test_clock_takes_the_lease_ticks_and_stops_promptly(spawn, master_env, database_url,
                                                        process_redis_url):
    from tasks import clock
    drop_queues(process_redis_url)  # only this clock's messages
    clock_proc = spawn(CLOCK, master_env("tasks"), "clock")
    scheduled = {actor.actor_name for actor, _ in clock.SCHEDULE}
    queues = {actor.queue_name for actor, _ in clock.SCHEDULE}

    def ticked():
        clock_proc.assert_running()
        sent = set().union(*(_queued_actors(process_redis_url, q) for q in queues))
        return scheduled <= sent
    # A new leader ticks every schedule entry at once.
    wait_for(ticked, timeout=30, what="the clock's first tick in Redis")
    assert "clock leading" in clock_proc.log(), clock_proc.log()
    assert "setup plugin" not in clock_proc.log(), clock_proc.log()  # alembic's start-up chatter
    sessions = _clock_sessions(database_url)
    assert [held for _pid, held in sessions] == [1], sessions
    took = assert_clean_stop(clock_proc, STOP_GRACE_S)
    assert took < 2, f"the clock took {took:.1f} s to stop after SIGTERM"
    wait_for(lambda: not _clock_sessions(database_url), timeout=5,
             what="the clock's lease session to end")


# ------------------------------------------------------------------ consume


def test_consume_turns_a_dropped_scan_into_a_document(spawn, master_env, app, client, admin_token,
                                                      tmp_path):
    """The Procfile's consume line with compose's environment (S3 store): a
    scan dropped into the folder is archived in the store and registered."""
    Api(client, admin_token).put_project("documents", kind="documents")
    folder = tmp_path / "consume"
    env = master_env("consume", FLEETHQ_CONSUME_DIR=str(folder))
    assert env["FLEETHQ_CONSUME_PROJECT"] == "documents"
    service = spawn(PROCFILE["consume"], env, "consume")
    wait_for(lambda: (folder / "done").is_dir() or service.assert_running(), 60, "the consumer")
    scans.scanned_pdf(tmp_path / "scan.pdf", [["lantern falcon"]])
    os.rename(tmp_path / "scan.pdf", folder / "scan.pdf")
    wait_for(lambda: (folder / "done" / "scan.pdf").exists() or service.assert_running(), 60,
             f"the scan consumed\n{service.log()}")
    (row,) = sql(app, "SELECT project_id, added_via FROM documents WHERE filename = 'scan.pdf'")
    assert tuple(row) == ("documents", "consume")
    assert_clean_stop(service, 20)


# ------------------------------------------------------------------ web, last


def test_web_stops_cleanly_on_sigterm(web):
    """After serving the module's fetchers: within the graceful timeout, no
    worker process left."""
    wait_ready(web, web.url)
    took = assert_clean_stop(web, GRACEFUL_TIMEOUT_S + 5)
    assert took < GRACEFUL_TIMEOUT_S, f"web took {took:.1f} s to stop"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_bad_setting_stops_the_process_with_one_line(name, spawn, master_env):
    """A setting that cannot work ends each process at start with exit status 2
    and one line naming it, not a traceback (nor, for gunicorn, workers that
    fail to boot one after another)."""
    service = spawn(PROCFILE[name], {**master_env(SERVICES[name]), "FLEETHQ_NODE_LEASE_S": "soon"},
                    f"bad-{name}")
    try:
        code = service.proc.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{shlex.join(service.argv)}` still running with a bad setting:\n{service.log()}")
    output = service.log()
    assert code == 2, output
    assert "fleethq: bad setting: NODE_LEASE_S must be an integer, not 'soon'" in output
    assert "Traceback" not in output, output
