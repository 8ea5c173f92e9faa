"""``tracker``: SavewebHQ's server command line, under its own name, on FleetHQ.

A SavewebHQ operator's scripts and unit files call ``tracker migrate``,
``tracker bootstrap-user``, ``tracker put-project``, ``tracker
enqueue-source``, ``tracker web-keygen`` and ``tracker serve`` with Go-style
flags (``-database-url URL``, ``-listen :8080``). These run FleetHQ's
``flask fleet`` commands of the same names (which take SavewebHQ's flags) and,
for ``serve``, gunicorn with the documented settings, the flags becoming
FleetHQ's settings. Go's flag package takes ``-flag`` and ``--flag``, with
the value after ``=`` or as the next word; so does this.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import sys
from pathlib import Path

COMMANDS = ("web-keygen", "migrate", "bootstrap-user", "put-project", "enqueue-source", "serve")
USAGE = "usage: tracker {web-keygen|migrate|bootstrap-user|put-project|enqueue-source|serve} [flags]"
_GO_FLAG = re.compile(r"\A-(?!-)([a-z][a-z0-9-]+)(=.*)?\Z")

# serve's flags → FleetHQ's settings (the environment of the gunicorn it becomes).
SERVE_FLAGS = {
    "listen": "FLEETHQ_BIND",
    "database-url": "DATABASE_URL",
    "public-url": "FLEETHQ_PUBLIC_URL",
    "github-client-id": "FLEETHQ_GITHUB_CLIENT_ID",
    "oauth-admin-org": "FLEETHQ_GITHUB_ORG",
    "oauth-admin-team": "FLEETHQ_GITHUB_ADMIN_TEAM",
    "web-session-secret-file": "FLEETHQ_SECRET_KEY_FILE",
    "github-client-secret-file": None,  # read here (0600), handed on as the secret
}


def go_flags(argv: list[str]) -> list[str]:
    """``-database-url X`` → ``--database-url X`` (single-letter flags stay)."""
    out = []
    for word in argv:
        match = _GO_FLAG.match(word)
        out.append(f"-{word}" if match and len(match.group(1)) > 1 else word)
    return out


def _fail(message: str) -> int:
    print(f"tracker: {message}", file=sys.stderr)
    return 2


def _serve_env(argv: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    words = go_flags(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ValueError(f"serve: unexpected argument {word!r}")
        name, eq, value = word[2:].partition("=")
        if name not in SERVE_FLAGS:
            raise ValueError(f"serve: flag provided but not defined: -{name}")
        if not eq:
            i += 1
            if i >= len(words):
                raise ValueError(f"serve: flag needs an argument: -{name}")
            value = words[i]
        i += 1
        if name == "listen":
            value = f"0.0.0.0{value}" if value.startswith(":") else value
        if name == "github-client-secret-file":
            info = os.stat(value)
            if stat.S_IMODE(info.st_mode) & 0o077:
                raise ValueError(f"serve: {value} must not be readable by group or others (chmod 600)")
            with open(value, encoding="utf-8") as fh:
                env["FLEETHQ_GITHUB_CLIENT_SECRET"] = fh.read().strip()
            continue
        env[SERVE_FLAGS[name]] = value
    env.setdefault("FLEETHQ_BIND", "0.0.0.0:8080")  # SavewebHQ's default -listen
    _keep_a_session_secret(env)
    return env


def _keep_a_session_secret(env: dict[str, str]) -> None:
    """SavewebHQ's serve runs without ``-web-session-secret-file``. FleetHQ's
    gunicorn workers must share one key (sessions, the sealed copies that let
    a machine token be viewed again), kept across restarts: without a key of
    its own the installation gets one in its data directory, made once, 0600."""
    if env.get("FLEETHQ_SECRET_KEY") or env.get("FLEETHQ_SECRET_KEY_FILE") \
            or env.get("HQ_WEB_SESSION_SECRET_FILE"):  # SavewebHQ's name (app.config)
        return
    data = Path(env.get("FLEETHQ_DATA_DIR") or "var")
    data.mkdir(parents=True, exist_ok=True)
    path = data / "secret_key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
    env["FLEETHQ_SECRET_KEY_FILE"] = str(path.resolve())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        return _fail(USAGE)
    command, rest = argv[0], argv[1:]
    if command == "serve":
        try:
            env = _serve_env(rest)
        except (ValueError, OSError) as exc:
            return _fail(str(exc))
        gunicorn = shutil.which("gunicorn", path=os.path.dirname(sys.executable)) or "gunicorn"
        os.execve(gunicorn, [gunicorn, "-c", "python:app.gunicorn_conf", "app:create_app()"], env)
    from flask.cli import FlaskGroup

    from app import create_app
    from app.cli import fleet
    group = FlaskGroup(name="tracker", create_app=create_app, add_default_commands=False,
                       add_version_option=False, load_dotenv=False, set_debug_flag=False)
    group.add_command(fleet)
    return group.main(args=["fleet", command, *go_flags(rest)], prog_name="tracker", standalone_mode=True)


if __name__ == "__main__":
    sys.exit(main())
