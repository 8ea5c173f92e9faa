"""``tracker``, SavewebHQ's server command line, under its own name (issue
"SavewebHQ's own programs in the suite" §3): SavewebHQ's README setup, Go-style
flags and all, runs on FleetHQ as written — migrate a fresh database, install
an ``hq_`` token from its 0600 file, put a project, serve it — and the served
master answers that token."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import requests

from tests.conftest import free_port
from tests.helpers import stop_group

TRACKER = os.path.join(os.path.dirname(sys.executable), "tracker")
HQ_TOKEN = "hq_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v"


def tracker(*argv, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([TRACKER, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def wait_serving(server: subprocess.Popen, base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, server.stdout.read().decode(errors="replace")[-2000:]
        try:
            if requests.get(base + "/healthz", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, "tracker serve did not answer in 60 s"
        time.sleep(0.3)


def test_savewebhqs_readme_setup_runs_under_the_name_tracker(scratch_database_url, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETHQ_", "HQ_")) and k not in (
        "DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env["FLEETHQ_DATA_DIR"] = str(tmp_path / "data")
    # SavewebHQ's spelling of the URL, with its sslmode parameter.
    db = scratch_database_url.replace("postgresql://", "postgres://") + "?sslmode=disable"
    usage = tracker(env=env)
    assert usage.returncode == 2 and "usage: tracker {web-keygen|migrate|" in usage.stderr
    assert tracker("migrate", "-database-url", db, env=env).returncode == 0
    token_file = tmp_path / "admin.token"
    token_file.write_text(HQ_TOKEN + "\n")
    token_file.chmod(0o600)
    installed = tracker("bootstrap-user", "-database-url", db, "-user-id", "admin", "-roles", "admin,worker",
                        "-machine-token-file", str(token_file), env=env)
    assert installed.returncode == 0, installed.stderr
    put = tracker("put-project", f"-database-url={db}", "-project-id", "sinavideo", env=env)
    assert put.returncode == 0, put.stderr
    port = free_port()
    server = subprocess.Popen([TRACKER, "serve", "-listen", f"127.0.0.1:{port}", "-database-url", db],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_serving(server, base)
        headers = {"Authorization": f"Bearer {HQ_TOKEN}"}
        assert requests.get(base + "/api/v1/whoami", headers=headers, timeout=10).json()["user_id"] == "admin"
        project = requests.get(base + "/api/v1/admin/projects/sinavideo", headers=headers, timeout=10)
        assert project.status_code == 200 and project.json()["id"] == "sinavideo"
        # Without -web-session-secret-file the workers share a key kept in the
        # data directory (0600), so a token issued through one is viewable again.
        key = tmp_path / "data" / "secret_key"
        assert key.exists() and key.stat().st_mode & 0o777 == 0o600
        users = base + "/api/v1/admin/users/api-worker"
        assert requests.put(users, json={"status": "active", "roles": ["worker"]}, headers=headers,
                            timeout=10).status_code == 204
        issued = requests.post(users + "/machine-token", headers=headers, timeout=10).json()
        viewed = requests.get(users + "/machine-token", headers=headers, timeout=10)
        assert viewed.status_code == 200 and viewed.json() == issued
    finally:
        stop_group(server, timeout=60)
    loose = tmp_path / "github-secret"
    loose.write_text("s3cret\n")
    loose.chmod(0o640)
    refused = tracker("serve", "-listen", ":0", "-github-client-secret-file", str(loose), env=env)
    assert refused.returncode == 2 and "chmod 600" in refused.stderr
    unknown = tracker("serve", "-listen", ":0", "-no-such-flag", "x", env=env)
    assert unknown.returncode == 2 and "flag provided but not defined: -no-such-flag" in unknown.stderr


def test_savewebhqs_environment_names_serve_without_flags(scratch_database_url, tmp_path):
    """An operator's SavewebHQ environment (its .env.example and compose file
    name HQ_DATABASE_URL, HQ_PUBLIC_URL, HQ_OAUTH_ADMIN_ORG/TEAM and 0600
    secret files) runs FleetHQ's tracker as it is, no flags but -listen."""
    session = tmp_path / "web-session.secret"
    session.write_text("a-session-secret-kept-by-savewebhq\n")
    session.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETHQ_", "HQ_")) and k not in (
        "DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env.update({"FLEETHQ_DATA_DIR": str(tmp_path / "data"),
                "HQ_DATABASE_URL": scratch_database_url.replace("postgresql://", "postgres://") + "?sslmode=disable",
                "HQ_PUBLIC_URL": "https://hq.example.org", "HQ_OAUTH_ADMIN_ORG": "saveweb",
                "HQ_OAUTH_ADMIN_TEAM": "core", "HQ_WEB_SESSION_SECRET_FILE": str(session)})
    assert tracker("migrate", env=env).returncode == 0
    token_file = tmp_path / "admin.token"
    token_file.write_text(HQ_TOKEN + "\n")
    token_file.chmod(0o600)
    installed = tracker("bootstrap-user", "-user-id", "admin", "-roles", "admin", "-machine-token-file",
                        str(token_file), env=env)
    assert installed.returncode == 0, installed.stderr
    port = free_port()
    server = subprocess.Popen([TRACKER, "serve", "-listen", f"127.0.0.1:{port}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_serving(server, base)
        whoami = requests.get(base + "/api/v1/whoami", headers={"Authorization": f"Bearer {HQ_TOKEN}"}, timeout=10)
        assert whoami.json() == {"user_id": "admin"}
        # The session secret came from SavewebHQ's file: no key was made in the data directory.
        assert not (tmp_path / "data" / "secret_key").exists()
    finally:
        stop_group(server, timeout=60)
