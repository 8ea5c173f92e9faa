"""``flask fleet set-tier | remote | local-worker``: the lanes of one queue
(app.fleet.lanes) from the master host."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from app.cli.group import emit, fail, fleet
from app.errors import FleetError
from app.fleet.models import TIERS
from workers import logs

# The master's own secrets and stores: the fetcher talks HTTP to the master
# like any worker and never gets them.
_NOT_FOR_THE_WORKER = ("DATABASE_URL", "REDIS_URL", "FLEETHQ_SECRET_KEY", "FLEETHQ_SECRET_KEY_FILE",
                       "FLEETHQ_DATABASE_URL", "FLEETHQ_REDIS_URL")


@fleet.command("set-tier")
@click.argument("worker_id")
@click.argument("tier", type=click.Choice(TIERS))
@click.option("--user", "user_id", default=None,
              help="For a token worker: the user whose machine token it uses.")
def set_tier(worker_id, tier, user_id):
    """Make a node (or a token worker, with --user) first choice, fallback, or
    auto (by each project's lane_order)."""
    from app.fleet import lanes
    try:
        emit(lanes.set_tier(worker_id, tier, user_id))
    except FleetError as exc:
        fail(exc)


@fleet.command("remote")
@click.argument("state", type=click.Choice(["on", "off", "status"]))
def remote(state):
    """Turn remote delegation on or off for the whole master (status: show it).

    Off: no worker but the local fetcher gets new jobs (they finish what they
    hold); on: every approved worker claims again.
    """
    from app.fleet import lanes
    if state == "status":
        emit({"remote": "on" if lanes.remote_enabled() else "off"})
    else:
        emit(lanes.set_remote(state == "on", actor="cli"))


def _default_master_url(data_dir: str) -> str:
    # The web process on this host: FLEETHQ_BIND's port (else PORT), else the
    # make dev stack running in this data directory (FLEETHQ_PORT), else 8400.
    bind = os.environ.get("FLEETHQ_BIND", "")
    port = bind.rsplit(":", 1)[-1] if ":" in bind else os.environ.get("PORT")
    if port is None:
        from app.config import stack_web_url
        found = stack_web_url(data_dir)
        if found:
            return found
    return f"http://127.0.0.1:{port or 8400}"


@fleet.command("local-worker", context_settings={"ignore_unknown_options": True})
@click.option("--tier", type=click.Choice(TIERS), default=None, envvar="FLEETHQ_FETCHER_TIER",
              help="auto (by each project's lane_order: first where it is local_first, "
                   "fallback where it is remote_first), or first / fallback for every project. "
                   "Kept when omitted; a new node is auto.")
@click.option("--concurrency", type=click.IntRange(1, 64), default=2, show_default=True,
              envvar="FLEETHQ_FETCHER_CONCURRENCY", help="Downloads at once.")
@click.option("--volume", type=click.Path(file_okay=False), default=None,
              envvar="FLEETHQ_FETCHER_VOLUME",
              help="The fetcher's own volume (identity, journal, PDFs); default DATA_DIR/fetcher.")
@click.option("--master-url", default=None, envvar="FLEETHQ_FETCHER_MASTER_URL",
              help="The master over loopback; default http://127.0.0.1:<FLEETHQ_BIND port>, "
                   "else the make dev stack of this data directory.")
@click.option("--name", default="local-fetcher", show_default=True, help="The node's display name.")
@click.option("--prepare-only", is_flag=True,
              help="Create (or find) the node and write its identity into the volume, then exit: "
                   "the worker program runs apart, where the database is out of its reach "
                   "(docker-compose.yml's fetcher-node and fetcher).")
@click.argument("worker_args", nargs=-1, type=click.UNPROCESSED)
def local_worker(tier, concurrency, volume, master_url, name, prepare_only, worker_args):
    """Run the worker program on the master host as the local fetcher.

    Creates and approves its node once, with the credential kept in its
    volume (a restart reuses it), then becomes ``fleethq-worker run`` against
    the master over HTTP. Arguments after ``--`` go to fleethq-worker (say
    ``-- --project papers``); its FLEETHQ_* settings are read as usual.
    """
    from flask import current_app

    from app.extensions import db
    from app.fleet import lanes
    from workers.runner.volume import Identity, Volume, VolumeError
    root = Path(volume or Path(current_app.config["DATA_DIR"]) / "fetcher")
    master_url = master_url or _default_master_url(current_app.config["DATA_DIR"])
    store = Volume(root)
    try:
        store.open()  # the lock: one fetcher per volume
        identity = store.load_identity()
    except VolumeError as exc:
        click.echo(f"error: local-worker: {exc}", err=True)
        sys.exit(1)
    if identity is None:
        identity = Identity.generate(name, master_url)
        store.save_identity(identity)  # before the node exists: a crash retries the same one
    try:
        node = lanes.ensure_local_node(identity.worker_id, identity.name, identity.secret, tier)
    except FleetError as exc:
        fail(exc)
    if not identity.registered:
        identity.registered = True
        store.save_identity(identity)
    store.close()  # fleethq-worker takes the lock again
    emit({**node, "volume": str(root), "master": master_url})
    if prepare_only:
        return
    db.session.remove()
    db.engine.dispose()  # the worker below has no database connection
    env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_THE_WORKER
           and not k.startswith("S3_")}
    env[logs.PROCESS_SETTING] = "fetcher"  # its log lines say which process they are
    argv = [sys.executable, "-m", "workers.runner.cli", "run", "--master", master_url,
            "--volume", str(root), "--concurrency", str(concurrency), "--allow-http",
            "--name", identity.name, *worker_args]
    sys.stdout.flush()
    os.execve(sys.executable, argv, env)
