"""``make dev``: the whole master on one machine, with no configuration (DESIGN §2).

Starts embedded PostgreSQL (``./var/pg``) and Redis (``./var/redis.sock``)
unless ``DATABASE_URL`` / ``REDIS_URL`` are set, migrates, creates the
development admin, runs web, tasks (the clock a thread of it, as in the
Procfile) and consume as children with prefixed output, waits for
``/readyz``, and fills a demo project. Then the pdf demo: the local
test publisher, a ``demo-papers`` project of 50 papers, and the ``fetcher``
(``flask fleet local-worker``, the Procfile's local lane, volume
``./var/fetcher``) that fetches and archives them while a progress bar runs.
With ``--no-demo`` there is no pdf project for it, so no fetcher starts. Ctrl-C or SIGTERM stops the children, then the
publisher, Redis and PostgreSQL.

    python -m app.dev [--no-demo] [--stop]
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from app.dev import embedded, state as devstate
from app.dev.demo import DEMO_PROJECT, demo, pdf_demo, start_publisher
from app.dev.demo_documents import PROJECT as DOCUMENTS_PROJECT
from app.dev.demo_documents import documents_demo, make_project
from app.dev.demo_ocr import ocr_demo
from app.dev.procs import Stack, StepFailed, Stop, print_lock, say, wait_ready


def banner(base: str, token: str, token_file: Path) -> str:
    return f"""
FleetHQ (development mode) is ready at {base}/
  dev admin machine token: {token}   (also in {token_file})

Try this in another shell:
  export HQ_URL={base} HQ_MACHINE_TOKEN_FILE={token_file}
  .venv/bin/hqctl whoami
  .venv/bin/hqctl project get {DEMO_PROJECT}
  seq 1 1000 | sed 's|^|https://example.org/n/|' | .venv/bin/hqctl enqueue --project-id {DEMO_PROJECT}
  .venv/bin/hqctl jobs list {DEMO_PROJECT} --status todo --limit 5
  curl -s $HQ_URL/metrics | grep fleethq_queue_depth
  .venv/bin/flask --app wsgi fleet projects     # host commands find this stack (var/devstack.json)

Ctrl-C stops everything; data stays in var/ for the next `make dev`.
"""


def secret_key(var: Path) -> str:
    """A stable key, so that sessions survive restarts and every gunicorn worker agrees."""
    path = var / "secret_key"
    if not path.exists():
        path.write_text("dev-" + secrets.token_hex(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def run(args) -> int:
    root = Path.cwd()
    var = root / "var"
    var.mkdir(exist_ok=True)
    port = int(os.environ.get("FLEETHQ_PORT") or 8400)
    if not embedded.port_is_free(port):
        raise StepFailed(f"127.0.0.1:{port} is in use; stop that process or set FLEETHQ_PORT")
    py = sys.executable
    token_file = var / "dev-admin.token"
    stack = Stack(var)
    try:
        services = stack.services()
        env = {**os.environ, **services,
               "FLEETHQ_DEV_MODE": "true", "FLEETHQ_DATA_DIR": str(var),
               "FLEETHQ_BIND": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
        key_file = None
        if not env.get("FLEETHQ_SECRET_KEY_FILE") and not env.get("FLEETHQ_SECRET_KEY"):
            secret_key(var)
            key_file = str(var / "secret_key")
            env["FLEETHQ_SECRET_KEY_FILE"] = key_file
        # Lets `flask --app wsgi fleet …` in another shell find this stack,
        # and seal machine tokens under the same key as its web processes.
        devstate.write(var, database_url=services["DATABASE_URL"], redis_url=services["REDIS_URL"],
                       secret_key_file=key_file, web_url=f"http://127.0.0.1:{port}")
        env.setdefault("FLEETHQ_LOG_JSON", "false")  # readable lines in a terminal

        stack.run_step("migrate", [py, "-m", "flask", "--app", "wsgi", "db", "upgrade"], env)
        stack.run_step("admin", [py, "-m", "flask", "--app", "wsgi", "fleet", "bootstrap-user",
                                 "--user-id", "dev-admin", "--roles", "admin,worker",
                                 "--machine-token-file", str(token_file)], env)
        if not token_file.exists():
            raise StepFailed(f"bootstrap-user wrote no token to {token_file}")
        token = token_file.read_text().strip()

        publisher = None
        if not args.no_demo:
            # Before web: the enrollment page's worker command names it.
            publisher = start_publisher(stack)
            env["FLEETHQ_DEV_PUBLISHER_URL"] = publisher.url
        stack.spawn("web", [py, "-m", "gunicorn", "-c", "python:app.gunicorn_conf", "wsgi:app"], env)
        stack.spawn("tasks", [py, "-m", "dramatiq", "tasks:setup_broker", "--processes", "1", "--threads", "4"],
                    {**env, "FLEETHQ_TASKS_CLOCK": "true"})
        stack.spawn("consume", [py, "-m", "flask", "--app", "wsgi", "fleet", "documents", "consume",
                                "--project", DOCUMENTS_PROJECT], env)

        base = f"http://127.0.0.1:{port}"
        wait_ready(stack, base)
        if not args.no_demo:
            demo(base, token)
            pdf_demo(stack, base, token, env, publisher)
            make_project(base, token)
            ocr_demo(stack, base, token, env)
            documents_demo(stack, base, token)
        with print_lock:
            print(banner(base, token, token_file.relative_to(root)), flush=True)
        while True:
            stack.check_children()
            time.sleep(0.5)
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave servers running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("devstack", "stopping")
        devstate.remove(var)
        stack.shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.dev", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-demo", action="store_true", help="do not create the demo project")
    parser.add_argument("--stop", action="store_true",
                        help="stop an embedded PostgreSQL left running in ./var/pg, then exit")
    args = parser.parse_args(argv)

    def on_term(signum, frame):
        raise Stop()
    signal.signal(signal.SIGTERM, on_term)

    try:
        if args.stop:
            stopped = embedded.stop_postgres(Path.cwd() / "var" / "pg")
            say("postgres", "stopped" if stopped else "not running")
            return 0
        return run(args)
    except (KeyboardInterrupt, Stop):
        return 0
    except (StepFailed, embedded.EmbeddedError) as exc:
        say("devstack", f"error: {exc}")
        return 1

