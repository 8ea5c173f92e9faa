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
