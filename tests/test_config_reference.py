"""docs/configuration.md and .env.example are generated from app/config.py
and must be current; every setting the code reads is declared there, with a
comment of its own."""
from __future__ import annotations

import os
import re

from app import config
from app.dev import config_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Keys the code reads that are not settings: built at load, or Flask's own.
DERIVED = {"LISTEN_DSN", "SQLALCHEMY_DATABASE_URI", "SQLALCHEMY_BINDS", "SECRET_KEY_GENERATED",
           "TESTING", "PERMANENT_SESSION_LIFETIME", "PREFERRED_URL_SCHEME",
           "SESSION_COOKIE_HTTPONLY", "SESSION_COOKIE_SAMESITE", "SESSION_COOKIE_SECURE",
           "WTF_CSRF_TIME_LIMIT"}
READ = re.compile(r"""(?:cfg|config|settings)(?:\.get)?[(\[]\s*"([A-Z][A-Z0-9_]+)\"""")


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def test_the_reference_and_the_env_example_are_current():
    assert _read("docs/configuration.md") == config_reference.render_markdown(), \
        "run: python -m app.dev.config_reference --write"
    assert _read(".env.example") == config_reference.render_env_example(), \
        "run: python -m app.dev.config_reference --write"


def test_every_setting_has_a_comment_of_its_own():
    settings = config_reference.settings()
    assert [s.name for s in settings if not s.comment] == []
    assert {s.name for s in settings} == {k for k in vars(config.Defaults) if k.isupper()} - set(
        config_reference.INTERNAL)


def test_every_setting_the_code_reads_is_declared():
    read = set()
    for top in ("app", "tasks"):
        for directory, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith(".py"):
                    with open(os.path.join(directory, name), encoding="utf-8") as f:
                        read |= set(READ.findall(f.read()))
    declared = {k for k in vars(config.Defaults) if k.isupper()}
    assert sorted(read - declared - DERIVED) == []


def test_the_env_example_names_every_variable_once():
    lines = [line[2:].split("=", 1)[0] for line in _read(".env.example").splitlines()
             if re.match(r"# [A-Z][A-Z0-9_]+=", line)]
    assert len(lines) == len(set(lines)) == len(config_reference.settings())
