"""Settings read from the environment: a number or switch that is not one is
refused at start with a message naming it."""
from __future__ import annotations

import os

import pytest

from app import config as app_config

NUMBERS = sorted(k for k, v in vars(app_config.Defaults).items()
                 if k.isupper() and isinstance(v, int) and not isinstance(v, bool))
SWITCHES = sorted(k for k, v in vars(app_config.Defaults).items()
                  if k.isupper() and isinstance(v, bool))


@pytest.mark.parametrize("key", NUMBERS)
def test_a_number_setting_refuses_text(key, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1/fleethq")
    if key.startswith("S3_"):  # the store's settings, plain S3_* text parsed as numbers
        monkeypatch.setenv(key, "soon")
        expected = rf"^{key} must be a number, not 'soon'$"
    else:
        monkeypatch.setenv(f"FLEETHQ_{key}", "soon")
        expected = rf"^{key} must be an integer.*not 'soon'$"
    with pytest.raises(app_config.ConfigError, match=expected):
        app_config.load()


def test_the_stores_numbers_may_be_fractions(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1/fleethq")
    monkeypatch.setenv("S3_CONNECT_TIMEOUT", "0.5")
    assert app_config.load()["S3_CONNECT_TIMEOUT"] == "0.5"


@pytest.mark.parametrize("key", SWITCHES)
def test_a_switch_refuses_anything_but_true_or_false(key, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1/fleethq")
    monkeypatch.setenv(f"FLEETHQ_{key}", "yes")
    with pytest.raises(app_config.ConfigError, match=rf"^{key} must be true or false, not 'yes'$"):
        app_config.load()


def test_the_defaults_pass_their_own_checks_unchanged(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("FLEETHQ_", "S3_")):
            monkeypatch.delenv(key)
    settings = app_config.load({"DATABASE_URL": "postgresql://postgres@127.0.0.1/fleethq"})
    for key in NUMBERS + SWITCHES:
        assert settings[key] == getattr(app_config.Defaults, key), key


def test_savewebhqs_setting_names_and_secret_files_work_as_they_are(monkeypatch, tmp_path):
    secret = tmp_path / "github-client-secret"
    secret.write_text("gh-secret\n")
    secret.chmod(0o600)
    session = tmp_path / "web-session-secret"
    session.write_text("a-session-secret-of-savewebhq\n")
    session.chmod(0o600)
    for name in ("DATABASE_URL", "FLEETHQ_DATABASE_URL", "FLEETHQ_SECRET_KEY", "FLEETHQ_SECRET_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HQ_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/savewebhq?sslmode=disable")
    monkeypatch.setenv("HQ_PUBLIC_URL", "https://hq.example.org")
    monkeypatch.setenv("HQ_GITHUB_CLIENT_ID", "Iv1.abc")
    monkeypatch.setenv("HQ_GITHUB_CLIENT_SECRET_FILE", str(secret))
    monkeypatch.setenv("HQ_WEB_SESSION_SECRET_FILE", str(session))
    monkeypatch.setenv("HQ_OAUTH_ADMIN_ORG", "saveweb")
    monkeypatch.setenv("HQ_OAUTH_ADMIN_TEAM", "core")
    cfg = app_config.load()
    assert cfg["DATABASE_URL"].startswith("postgres://postgres@127.0.0.1:5432/savewebhq")
    assert cfg["SQLALCHEMY_DATABASE_URI"].startswith("postgresql+psycopg://")
    assert (cfg["PUBLIC_URL"], cfg["GITHUB_CLIENT_ID"], cfg["GITHUB_CLIENT_SECRET"]) == (
        "https://hq.example.org", "Iv1.abc", "gh-secret")
    assert (cfg["GITHUB_ORG"], cfg["GITHUB_ADMIN_TEAM"]) == ("saveweb", "core")
    assert cfg["SECRET_KEY"] == "a-session-secret-of-savewebhq"
    # FleetHQ's own names win where both are set.
    monkeypatch.setenv("FLEETHQ_GITHUB_ORG", "fleet-org")
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1/fleethq")
    cfg = app_config.load()
    assert (cfg["GITHUB_ORG"], cfg["DATABASE_URL"]) == ("fleet-org", "postgresql://postgres@127.0.0.1/fleethq")


def test_a_savewebhq_secret_file_others_can_read_is_refused(monkeypatch, tmp_path):
    secret = tmp_path / "github-client-secret"
    secret.write_text("gh-secret\n")
    secret.chmod(0o644)
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1/fleethq")
    monkeypatch.setenv("HQ_GITHUB_CLIENT_SECRET_FILE", str(secret))
    with pytest.raises(app_config.ConfigError, match="must not allow group or other access"):
        app_config.load()
