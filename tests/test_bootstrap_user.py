"""``flask fleet bootstrap-user`` as SavewebHQ's ``tracker bootstrap-user``
(C3): it installs the token an operator put in a 0600 file, and writes a new
one only when the file is empty or missing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from app.accounts import service as accounts
from tests.helpers import db_rows

ROOT = Path(__file__).resolve().parent.parent
SAVEWEBHQ_TOKEN = "hq_3q2-7Zb9xYwVuTsRqPoNmLkJiHgFeDcBa0123456789"


@pytest.fixture
def cli(app):
    runner = app.test_cli_runner()  # click ≥ 8.2 keeps stdout and stderr apart

    def invoke(*args):
        return runner.invoke(args=["fleet", "bootstrap-user", *args])
    return invoke


def _secret_file(path: Path, content: str, mode: int = 0o600) -> Path:
    path.write_text(content)
    path.chmod(mode)
    return path


def _whoami(live_server, token: str) -> requests.Response:
    return requests.get(f"{live_server.url}/api/v1/whoami", timeout=10,
                        headers={"Authorization": f"Bearer {token}"})


def _user(app, user_id: str) -> list[dict]:
    return db_rows(app, "SELECT status, roles FROM users WHERE id = :u", u=user_id)


def test_a_savewebhq_token_file_is_installed_not_overwritten(app, cli, live_server, tmp_path):
    token_file = _secret_file(tmp_path / "alice.token", SAVEWEBHQ_TOKEN + "\n")
    before = token_file.stat()
    result = cli("--user-id", "alice", "--roles", "admin,worker",
                 "--machine-token-file", str(token_file))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # as SavewebHQ: nothing on success
    assert token_file.read_text() == SAVEWEBHQ_TOKEN + "\n"
    assert token_file.stat().st_mtime_ns == before.st_mtime_ns
    response = _whoami(live_server, SAVEWEBHQ_TOKEN)
    assert response.status_code == 200 and response.json() == {"user_id": "alice"}
    assert _user(app, "alice") == [{"status": "active", "roles": ["admin", "worker"]}]
    with app.app_context():
        assert accounts.view_token("alice") == SAVEWEBHQ_TOKEN

    # Run again (a restart of the deployment): same token, still working.
    assert cli("--user-id", "alice", "--roles", "admin,worker",
               "--machine-token-file", str(token_file)).exit_code == 0
    assert _whoami(live_server, SAVEWEBHQ_TOKEN).status_code == 200


@pytest.mark.parametrize("content", ["", "\n", "  \n\n"])
def test_an_empty_file_gets_a_new_token(app, cli, live_server, tmp_path, content):
    token_file = _secret_file(tmp_path / "bob.token", content)
    result = cli("--user-id", "bob", "--machine-token-file", str(token_file))
    assert result.exit_code == 0, result.output
    token = token_file.read_text().strip()
    assert token.startswith("fhq_")
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert _whoami(live_server, token).json() == {"user_id": "bob"}
    assert _user(app, "bob") == [{"status": "active", "roles": ["worker"]}]  # default as SavewebHQ


def test_a_missing_file_is_created_0600(app, cli, live_server, tmp_path):
    token_file = tmp_path / "carol.token"
    assert cli("--user-id", "carol", "--roles", "worker",
               "--machine-token-file", str(token_file)).exit_code == 0
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    assert _whoami(live_server, token).status_code == 200
    # The next run installs what the file now holds instead of a new token.
    assert cli("--user-id", "carol", "--machine-token-file", str(token_file)).exit_code == 0
    assert token_file.read_text().strip() == token
    assert _whoami(live_server, token).status_code == 200


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
@pytest.mark.parametrize("content", [SAVEWEBHQ_TOKEN, ""])
def test_a_group_or_world_accessible_file_is_refused(app, cli, tmp_path, mode, content):
    token_file = _secret_file(tmp_path / "dave.token", content, mode)
    result = cli("--user-id", "dave", "--machine-token-file", str(token_file))
    assert result.exit_code == 1
    assert "must not allow group or other access" in result.stderr
    assert _user(app, "dave") == []
    assert token_file.read_text() == content


@pytest.mark.parametrize("content, why", [
    ("hq_two words", "without spaces"),
    ("x" * 1025, "invalid secret"),
    ("fhqn_" + "a" * 43, "enrolled-node secrets"),
])
def test_a_token_that_cannot_work_is_refused(app, cli, tmp_path, content, why):
    token_file = _secret_file(tmp_path / "erin.token", content)
    result = cli("--user-id", "erin", "--machine-token-file", str(token_file))
    assert result.exit_code == 1 and why in result.stderr
    assert _user(app, "erin") == []


@pytest.mark.parametrize("roles, why", [("admin,boss", 'unknown role "boss"'),
                                        ("", 'unknown role ""')])
def test_unknown_roles_are_refused(app, cli, tmp_path, roles, why):
    result = cli("--user-id", "frank", "--roles", roles,
                 "--machine-token-file", str(tmp_path / "frank.token"))
    assert result.exit_code == 1 and why in result.stderr
    assert not (tmp_path / "frank.token").exists()


def test_without_a_file_the_new_token_is_printed(app, cli, live_server):
    result = cli("--user-id", "gina", "--roles", "admin")
    assert result.exit_code == 0
    token = result.stdout.strip()
    assert token.startswith("fhq_")
    assert _whoami(live_server, token).json() == {"user_id": "gina"}


def test_bootstrap_replaces_roles_status_and_token(app, cli, live_server, make_user, tmp_path):
    old = make_user("hank", ["reader"])
    with app.app_context():
        accounts.put_user("hank", ["reader"], "suspended")
    token_file = _secret_file(tmp_path / "hank.token", SAVEWEBHQ_TOKEN)
    assert cli("--user-id", "hank", "--roles", "worker",
               "--machine-token-file", str(token_file)).exit_code == 0
    assert _user(app, "hank") == [{"status": "active", "roles": ["worker"]}]
    assert _whoami(live_server, old).status_code == 401
    assert _whoami(live_server, SAVEWEBHQ_TOKEN).status_code == 200


def test_database_url_overrides_the_configured_database(database_url, live_server, tmp_path):
    """The real command line, on a master configured with an unreachable database."""
    token_file = _secret_file(tmp_path / "ivy.token", SAVEWEBHQ_TOKEN)
    env = {**os.environ, "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
           "FLEETHQ_SECRET_KEY": "test-secret-key", "FLEETHQ_LOG_JSON": "false"}
    command = [sys.executable, "-m", "flask", "--app", "wsgi", "fleet", "bootstrap-user",
               "--database-url", database_url, "--user-id", "ivy", "--roles", "admin,worker",
               "--machine-token-file", str(token_file)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert _whoami(live_server, SAVEWEBHQ_TOKEN).json() == {"user_id": "ivy"}
    viewed = requests.get(f"{live_server.url}/api/v1/admin/users/ivy/machine-token", timeout=10,
                          headers={"Authorization": f"Bearer {SAVEWEBHQ_TOKEN}"})
    assert viewed.json() == {"user_id": "ivy", "token": SAVEWEBHQ_TOKEN}

    # Without the override the configured (unreachable) database is used: a clear error.
    refused = subprocess.run(command[:7] + command[9:], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1 and "error: cannot connect to the database" in refused.stderr
