"""``flask --app wsgi fleet`` speaks SavewebHQ's ``tracker`` commands.

The command lines below are SavewebHQ's README and operations runbook,
character for character; a shell function ``tracker`` stands for
``flask --app wsgi fleet``. Each runs as an operator types it (a real shell,
the real ``flask`` entry point) and the test checks the printed summary and
the database afterwards.
"""
from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys

import pytest

from tests.conftest import closed_port_url, free_port, make_app
from tests.helpers import db_rows, latest_revision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def shell(script: str, *, hq_database_url: str, cwd=ROOT, **env) -> subprocess.CompletedProcess:
    """Run ``script`` in bash with ``tracker`` = ``flask --app wsgi fleet``.

    ``DATABASE_URL`` points at a closed port, so a command that ignored
    ``--database-url "$HQ_DATABASE_URL"`` would fail.
    """
    full = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "HQ_DATABASE_URL": hq_database_url,
            "DATABASE_URL": closed_port_url(), "FLEETHQ_LOG_JSON": "false",
            "PYTHONPATH": ROOT, **env}
    prelude = f'tracker() {{ flask --app "{ROOT}/wsgi.py" fleet "$@"; }}\nset -e\n'
    return subprocess.run(["bash", "-c", prelude + script], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=180)


def project_row(app, project_id: str) -> dict:
    (row,) = db_rows(app, "SELECT * FROM projects WHERE id = :p", p=project_id)
    return row


def cli(app, *args):
    return app.test_cli_runner().invoke(args=["fleet", *args])


def assert_refused(result, *needles):
    """A domain error: exit 1, ``error: code: message`` first (then its details), no traceback."""
    assert result.exit_code == 1, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: ") and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in first, first


def assert_one_line_error(result, *needles):
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ------------------------------------------------------------------ put-project

README_PUT_PROJECT = """\
tracker put-project \\
  --database-url "$HQ_DATABASE_URL" \\
  --project-id sinavideo \\
  --identity-mode external_id \\
  --dispatch-qps 250 \\
  --worker-claim-qps 0.2 \\
  --max-jobs-per-claim 64 \\
  --recommended-lease-seconds 300 \\
  --client-versions sinavideo/2.4.0
"""


def test_readme_put_project(app, database_url):
    done = shell(README_PUT_PROJECT, hq_database_url=database_url)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["created"] is True
    assert (summary["id"], summary["dispatch_qps"], summary["worker_claim_qps"]) == ("sinavideo", 250, 0.2)
    row = project_row(app, "sinavideo")
    assert (row["status"], row["identity_mode"], row["claim_order"]) == ("active", "external_id", "fifo")
    assert (row["dispatch_qps"], row["worker_claim_qps"]) == (250.0, 0.2)
    assert (row["max_jobs_per_claim"], row["max_resets"], row["recommended_lease_seconds"]) == (64, 3, 300)
    assert row["client_versions"] == ["sinavideo/2.4.0"]

    again = shell(README_PUT_PROJECT, hq_database_url=database_url)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["created"] is False
    assert project_row(app, "sinavideo")["policy_version"] == row["policy_version"]  # nothing changed


def test_runbook_put_project_with_claim_order_and_policy_flags(app, database_url):
    """operations.md step 3: mode and order, then the optional live-policy flags."""
    done = shell('tracker put-project --database-url "$HQ_DATABASE_URL" --project-id crawl '
                 "--identity-mode unique_value --claim-order random --max-resets 7 "
                 "--dispatch-qps 1e-300 --client-versions 'crawler/1.0, crawler/1.1'",
                 hq_database_url=database_url)
    assert done.returncode == 0, done.stderr
    row = project_row(app, "crawl")
    assert (row["identity_mode"], row["claim_order"], row["max_resets"]) == ("unique_value", "random", 7)
    assert row["dispatch_qps"] == 1e-300 and row["worker_claim_qps"] is None
    assert row["client_versions"] == ["crawler/1.0", "crawler/1.1"]  # each entry trimmed

    # tracker's update: omitted flags take their defaults (an omitted QPS means
    # unlimited, an omitted --client-versions none), the claim order stays.
    done = shell('tracker put-project --database-url "$HQ_DATABASE_URL" --project-id crawl --max-resets 2',
                 hq_database_url=database_url)
    assert done.returncode == 0, done.stderr
    row = project_row(app, "crawl")
    assert (row["identity_mode"], row["claim_order"], row["max_resets"]) == ("unique_value", "random", 2)
    assert (row["dispatch_qps"], row["client_versions"]) == (None, [])

    changed = shell('tracker put-project --database-url "$HQ_DATABASE_URL" --project-id crawl '
                    "--identity-mode none", hq_database_url=database_url)
    assert changed.returncode == 1
    assert "invalid_request" in changed.stderr and "identity_mode" in changed.stderr
    assert "Traceback" not in changed.stderr
    assert project_row(app, "crawl")["identity_mode"] == "unique_value"


def test_put_project_keeps_fleethq_fields_the_tracker_flags_do_not_set(app, ctx):
    from app.projects import service
    result = cli(app, "put-project", "papers", "--kind", "pdf", "--max-in-flight", "9",
                 "--claim-order", "random")
    assert result.exit_code == 0, result.output
    result = cli(app, "put-project", "--project-id", "papers", "--dispatch-qps", "5")
    assert result.exit_code == 0, result.output
    project = service.view("papers")
    assert (project.kind, project.max_in_flight, project.claim_order) == ("pdf", 9, "random")
    assert project.dispatch_qps == 5.0


def test_put_project_sets_max_worker_attempts(app, ctx):
    from app.projects import service
    result = cli(app, "put-project", "papers", "--kind", "pdf")
    assert result.exit_code == 0, result.output
    assert service.view("papers").max_worker_attempts == 3   # the pdf default
    result = cli(app, "put-project", "papers", "--max-worker-attempts", "5")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["max_worker_attempts"] == 5
    assert service.view("papers").max_worker_attempts == 5


@pytest.mark.parametrize("raw", ["0", "21", '"3"', "x"])
def test_put_project_refuses_a_bad_max_worker_attempts(app, raw):
    result = cli(app, "put-project", "papers", "--kind", "pdf", "--max-worker-attempts", raw)
    assert_refused(result, "invalid_request", "max_worker_attempts")
    assert db_rows(app, "SELECT id FROM projects") == []


def test_put_project_help_explains_the_deadline_and_the_worker_cap(app):
    result = cli(app, "put-project", "--help")
    assert result.exit_code == 0
    flat = " ".join(result.output.split())
    assert "counted from its first claim, not from enqueue" in flat
    assert "the most distinct workers that may try one job" in flat


@pytest.mark.parametrize("raw, stored", [("", None), ("  ", None), ("null", None), ("0.1", 0.1),
                                         ("1000", 1000.0), ("1e300", 1e300)])
def test_put_project_qps_values(app, raw, stored):
    result = cli(app, "put-project", "--project-id", "q", "--dispatch-qps", raw, "--worker-claim-qps", raw)
    assert result.exit_code == 0, result.output
    row = project_row(app, "q")
    assert (row["dispatch_qps"], row["worker_claim_qps"]) == (stored, stored)


@pytest.mark.parametrize("raw", ["0", "-1", "NaN", "Inf", "fast"])
def test_put_project_refuses_a_qps_that_is_not_positive_and_finite(app, raw):
    result = cli(app, "put-project", "--project-id", "q", "--dispatch-qps", raw)
    assert_refused(result, "invalid_request", "dispatch_qps")
    assert db_rows(app, "SELECT id FROM projects") == []


@pytest.mark.parametrize("raw, stored", [("", []), ("a", ["a"]), (" b , a ", ["a", "b"])])
def test_put_project_client_versions(app, raw, stored):
    result = cli(app, "put-project", "--project-id", "cv", "--client-versions", raw)
    assert result.exit_code == 0, result.output
    assert project_row(app, "cv")["client_versions"] == stored


@pytest.mark.parametrize("raw", ["a,,b", "a,", " ", "a,a", "a, a"])
def test_put_project_refuses_empty_or_repeated_client_versions(app, raw):
    result = cli(app, "put-project", "--project-id", "cv", "--client-versions", raw)
    assert_refused(result, "invalid_request", "client_versions")


def test_put_project_max_jobs_per_claim_zero_means_the_largest_batch(app):
    assert cli(app, "put-project", "--project-id", "z", "--max-jobs-per-claim", "0").exit_code == 0
    assert project_row(app, "z")["max_jobs_per_claim"] == 256
    result = cli(app, "put-project", "--project-id", "z", "--max-jobs-per-claim", "257")
    assert_refused(result, "invalid_request", "max_jobs_per_claim")


def test_put_project_needs_one_project_id(app):
    assert cli(app, "put-project").exit_code == 2
    result = cli(app, "put-project", "a", "--project-id", "b")
    assert result.exit_code == 2 and "once" in result.output
    assert cli(app, "put-project", "same", "--project-id", "same").exit_code == 0
    assert db_rows(app, "SELECT id FROM projects") == [{"id": "same"}]


def test_put_project_patch_changes_only_the_given_fields(app):
    assert cli(app, "put-project", "p", "--max-resets", "9", "--client-versions", "x").exit_code == 0
    assert cli(app, "put-project", "p", "--patch", "--dispatch-qps", "2").exit_code == 0
    row = project_row(app, "p")
    assert (row["max_resets"], row["client_versions"], row["dispatch_qps"]) == (9, ["x"], 2.0)


# ------------------------------------------------------------------ migrate

def test_runbook_migrate(scratch_database_url):
    done = shell('tracker migrate --database-url "$HQ_DATABASE_URL"', hq_database_url=scratch_database_url)
    assert done.returncode == 0, done.stderr
    application = make_app(scratch_database_url, check_schema=False)
    with application.app_context():
        from app.extensions import db
        revision = db.session.execute(db.text("SELECT version_num FROM alembic_version")).scalar()
        tables = db.session.execute(db.text("SELECT to_regclass('projects') IS NOT NULL")).scalar()
        db.session.remove()
        db.engine.dispose()
    assert (revision, tables) == (latest_revision(), True)

    again = shell('tracker migrate --database-url "$HQ_DATABASE_URL"', hq_database_url=scratch_database_url)
    assert again.returncode == 0, again.stderr  # nothing left to do


def test_commands_on_an_unmigrated_database_say_so(scratch_database_url):
    done = shell('tracker put-project --database-url "$HQ_DATABASE_URL" --project-id p',
                 hq_database_url=scratch_database_url)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not migrated" in lines[0] and "fleet migrate" in lines[0], done.stderr


# ------------------------------------------------------------------ web-keygen

def test_web_keygen_writes_a_private_secret_and_never_overwrites(tmp_path, database_url):
    os.mkdir(tmp_path / "secrets", 0o700)
    done = shell("tracker web-keygen --out secrets/tracker-web.secret",
                 hq_database_url=database_url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "secrets" / "tracker-web.secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.endswith("\n")
    assert len(base64.urlsafe_b64decode(text.strip() + "=")) == 32

    again = shell("tracker web-keygen --out secrets/tracker-web.secret",
                  hq_database_url=database_url, cwd=tmp_path)
    assert again.returncode == 1 and "web-keygen" in again.stderr
    assert path.read_text() == text


def test_the_secret_key_can_come_from_a_web_keygen_file(app, database_url, tmp_path, monkeypatch):
    path = tmp_path / "web.secret"
    result = cli(make_app(closed_port_url(), check_schema=False), "web-keygen", "--out", str(path))
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("FLEETHQ_SECRET_KEY_FILE", str(path))
    assert make_app(closed_port_url(), check_schema=False).config["SECRET_KEY"] == path.read_text().strip()

    # --database-url builds an app of its own on the same settings, key included.
    result = cli(make_app(closed_port_url(), check_schema=False), "put-project", "--project-id", "k",
                 "--database-url", database_url)
    assert result.exit_code == 0, result.output

    path.chmod(0o640)
    with pytest.raises(ValueError, match="group or other"):
        make_app(closed_port_url(), check_schema=False)
    path.chmod(0o600)
    monkeypatch.setenv("FLEETHQ_SECRET_KEY", "another")
    with pytest.raises(ValueError, match="not both"):
        make_app(closed_port_url(), check_schema=False)


def test_an_all_digit_secret_key_is_taken_as_text(monkeypatch):
    """Settings that hold text keep it as given: a secret of digits only (or
    one that reads as JSON) is not turned into a number, while numeric
    settings still are."""
    monkeypatch.setenv("FLEETHQ_SECRET_KEY", "0123456789012345")
    monkeypatch.setenv("FLEETHQ_PUBLIC_URL", "true")
    monkeypatch.setenv("FLEETHQ_FLEET_POOL_SIZE", "32")
    config = make_app(closed_port_url(), check_schema=False).config
    assert config["SECRET_KEY"] == "0123456789012345"
    assert config["PUBLIC_URL"] == "true"
    assert config["FLEET_POOL_SIZE"] == 32


# ------------------------------------------------------------------ --database-url

def test_database_url_flag_overrides_database_url_and_empty_means_not_given(app, database_url):
    done = shell('tracker put-project --database-url "$HQ_DATABASE_URL" --project-id here',
                 hq_database_url=database_url)
    assert done.returncode == 0, done.stderr
    # The flag empty (an unset variable): DATABASE_URL decides.
    done = shell('tracker put-project --database-url "$UNSET_VARIABLE" --project-id there',
                 hq_database_url="", DATABASE_URL=database_url)
    assert done.returncode == 0, done.stderr
    assert db_rows(app, "SELECT id FROM projects ORDER BY id") == [{"id": "here"}, {"id": "there"}]


# ------------------------------------------------------------------ unreachable database

def test_an_unreachable_database_is_one_line_on_stderr(database_url):
    """The real entry point: no traceback and no log lines, exit status 1."""
    done = shell("tracker projects", hq_database_url=database_url,
                 DATABASE_URL=f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/fleethq",
                 FLEETHQ_LOG_JSON="true")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: cannot connect to the database postgresql://postgres:***@127.0.0.1:")
    assert "s3cret" not in done.stderr and done.stdout == ""


# Every `flask fleet` command that reads or writes the database, with valid arguments.
DATABASE_COMMANDS = {
    "bootstrap-user": ["--user-id", "u", "--machine-token-file", "{token}"],
    "put-project": ["--project-id", "p"],
    "projects": [],
    "enqueue-source": ["--project-id", "p", "--input", "{source}"],
    "migrate": [],
    "users": [],
    "put-user": ["u"],
    "rotate-token": ["u"],
    "revoke-token": ["u"],
    "sweep": [],
    "enroll": [],
    "worker": ["approve", "node-0123456789abcdef"],
    "workers": [],
    "held": [],
    "release-held": ["1"],
    "add-hook": ["p", "--name", "n", "--url", "https://hooks.example.org/h"],
    "import-savewebhq": ["--from-database-url", "{target}", "--dry-run"],
    "set-tier": ["node-0123456789abcdef", "fallback"],
    "remote": ["off"],
    "local-worker": ["--volume", "{volume}"],
    "audit": [],
    "documents": ["add", "--project", "p", "{source}"],
    "reindex": [],
    "sites": ["rekey"],
}
NO_DATABASE_COMMANDS = {"web-keygen"}


def test_every_command_is_covered_below():
    from app.cli import fleet
    assert set(fleet.commands) == set(DATABASE_COMMANDS) | NO_DATABASE_COMMANDS, (
        "add the new command to DATABASE_COMMANDS (or NO_DATABASE_COMMANDS)")


@pytest.mark.parametrize("command", sorted(DATABASE_COMMANDS))
def test_every_command_reports_an_unreachable_database_in_one_line(command, tmp_path):
    from workers.wire.source import write_source
    source = tmp_path / "jobs.jsonl.zst"
    with open(source, "wb") as fh:
        write_source([{"id": "a", "value": "x"}], fh)
    token = tmp_path / "u.token"
    token.write_text("fhq_" + "a" * 43 + "\n")
    token.chmod(0o600)
    url = closed_port_url()
    application = make_app(url, check_schema=False)
    args = [a.format(source=source, token=token, target=url, volume=tmp_path / "fetcher")
            for a in DATABASE_COMMANDS[command]]
    result = cli(application, command, *args)
    assert_one_line_error(result, "cannot connect to the database", url)
    assert "Traceback" not in result.output


def test_an_unreachable_database_url_flag_is_named_in_the_error(app):
    url = closed_port_url()
    result = cli(app, "enqueue-source", "--database-url", url, "--project-id", "p", "--input", "-")
    assert_one_line_error(result, f"cannot connect to the database {url}")
