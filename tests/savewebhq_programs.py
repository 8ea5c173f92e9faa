"""SavewebHQ's own programs, run by the tests beside FleetHQ.

FleetHQ promises to be a drop-in SavewebHQ, so the drop-in tests drive the
real thing: SavewebHQ's server ``tracker``, its ``hqctl`` and ``source``, a
worker on its Go SDK (``swpworker``) and its Python SDK (``saveweb_hq``),
unchanged, as the project's shared folder holds them (``savewebhq/`` beside
this checkout: ``bin/`` and ``python/``). ``FLEETHQ_SAVEWEBHQ_DIR`` names
another place.

Those programs are not FleetHQ's to carry in its own tree; like PostgreSQL
and Redis they are a service the suite needs: where they are not found the
tests that need them fail, naming the place they looked.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import requests

from tests.conftest import PG_HOST, PG_PORT, PG_USER, free_port

ROOT = Path(__file__).resolve().parent.parent
HOME = Path(os.environ.get("FLEETHQ_SAVEWEBHQ_DIR") or ROOT.parent / "shared" / "savewebhq")
CLIENT_VERSION = "contract-v1"


def program(name: str) -> str:
    """The path of one of SavewebHQ's programs (tracker, hqctl, source, swpworker)."""
    path = HOME / "bin" / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"SavewebHQ's {name} is not at {path} (set FLEETHQ_SAVEWEBHQ_DIR)", pytrace=False)
    return str(path)


def python_sdk():
    """SavewebHQ's Python SDK, the ``saveweb_hq`` package, imported from its folder."""
    folder = HOME / "python"
    if not (folder / "saveweb_hq" / "__init__.py").exists():
        pytest.fail(f"SavewebHQ's Python SDK is not at {folder} (set FLEETHQ_SAVEWEBHQ_DIR)", pytrace=False)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    import saveweb_hq
    return saveweb_hq


def token_file(directory: Path, name: str) -> tuple[Path, str]:
    """A 0600 file holding a new SavewebHQ-style machine token, as its README makes one."""
    token = "hq_" + secrets.token_urlsafe(32)
    path = directory / f"{name}.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path, token


def run(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run one of the programs; a non-zero exit fails the test with what it printed."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}\nstdout: {done.stdout[-2000:]}\n"
        f"stderr: {done.stderr[-2000:]}")
    return done


class Tracker:
    """SavewebHQ's server on a database of its own (created here, dropped by ``stop``)."""

    def __init__(self, log_path: Path):
        self.binary = program("tracker")
        self.dbname = f"savewebhq_ref_{os.getpid()}_{secrets.token_hex(3)}"
        with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{self.dbname}"')
        self.database_url = f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.dbname}?sslmode=disable"
        run([self.binary, "migrate", "--database-url", self.database_url])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}",
             "--database-url", self.database_url], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"tracker exited:\n{self.log()}"
            try:
                if requests.get(self.url + "/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, f"tracker did not become healthy:\n{self.log()}"
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def bootstrap_user(self, user_id: str, roles: str, token_path: Path) -> None:
        run([self.binary, "bootstrap-user", "--database-url", self.database_url,
             "--user-id", user_id, "--roles", roles, "--machine-token-file", str(token_path)])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


def install_user(app, user_id: str, roles: list[str], token: str) -> None:
    """Install a user and the token its file holds into FleetHQ, as
    ``flask fleet bootstrap-user --machine-token-file`` does."""
    from app.accounts import service as accounts
    from app.extensions import db
    with app.app_context():
        accounts.put_user_and_token(user_id, roles, token)
        db.session.remove()


def one_job_project(app, url: str, directory: Path, project: str) -> str:
    """An admin and a worker installed as SavewebHQ's README makes them, and
    ``project`` put through ``url`` with one job (``j1``) in it: returns the
    worker's token."""
    from tests.savewebhq_wire import Wire, admin_path, project_body
    _, admin = token_file(directory, "admin")
    _, worker = token_file(directory, "worker")
    install_user(app, "hq-admin", ["admin"], admin)
    install_user(app, "hq-worker", ["worker"], worker)
    setup = Wire(url, admin)
    assert setup.put(admin_path(project), project_body()).status in (200, 201)
    assert setup.post(admin_path(project, "/jobs"), {"jobs": [{"id": "j1", "value": "v1"}]}).status == 200
    return worker
