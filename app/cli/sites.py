"""``flask fleet sites …``: the publishers the fleet fetches from and the
politeness the whole fleet keeps towards each (app.sites, docs/politeness.md)."""
from __future__ import annotations

import click

from app.cli.group import emit, fail, fleet
from app.cli.tables import Column, json_option, key, render, table_wanted, when
from app.errors import FleetError

_REASON = click.option("--reason", default=None, help="Why (kept in the audit log).")
_PROJECT = click.option("--project", "project_id", default=None,
                        help="Only this project's jobs (replaces the fleet-wide rule there).")


@fleet.group("sites")
def sites():
    """Site keys, limits, groups and pauses."""


def _run(action, *args, **kwargs):
    try:
        emit(action(*args, **kwargs))
    except FleetError as exc:
        fail(exc)


LIMIT_COLUMNS = [key("site"), Column("PROJECT", lambda r: r["project_id"] or "(all)"),
                 key("in_flight", "IN FLIGHT", right=True), key("max_in_flight", "MAX IN FLIGHT", right=True),
                 key("max_starts_per_s", "MAX STARTS/S", right=True),
                 Column("UPDATED", lambda r: when(r["updated_at"]))]
PAUSE_COLUMNS = [key("site"), Column("UNTIL", lambda r: when(r["until"])), key("source"),
                 key("strikes", right=True), key("reason")]
GROUP_COLUMNS = [key("site"), Column("KEYS", lambda r: r["keys"])]


@sites.command("list")
@json_option
def list_sites(as_json):
    """The limits (with their attempts in flight now), groups and pauses in force."""
    from app.sites import service
    found = service.overview()
    if not table_wanted(as_json):
        emit(found)
        return
    for title, rows, columns in (("Limits", found["limits"], LIMIT_COLUMNS),
                                 ("Groups", found["groups"], GROUP_COLUMNS),
                                 ("Pauses in force", found["pauses"], PAUSE_COLUMNS)):
        click.echo(f"{title}:")
        click.echo(render(rows, columns) if rows else "(none)")
        click.echo()


@sites.command("limit")
@click.argument("site")
@_PROJECT
@click.option("--max-in-flight", type=int, default=None, metavar="N",
              help="At most N attempts of this site in flight at once (0 stops it).")
@click.option("--max-starts-per-s", type=float, default=None, metavar="R",
              help="At most R new attempts of this site per second (0.2: one every 5 s).")
@_REASON
def limit(site, project_id, max_in_flight, max_starts_per_s, reason):
    """Limit SITE (a site key such as 10.1016 or example.org, or a group) across the fleet."""
    from app.sites import service
    _run(service.set_limit, site, project_id=project_id, max_in_flight=max_in_flight,
         max_starts_per_s=max_starts_per_s, reason=reason)


@sites.command("unlimit")
@click.argument("site")
@_PROJECT
@_REASON
def unlimit(site, project_id, reason):
    """Remove SITE's fleet-wide rule (or, with --project, that project's)."""
    from app.sites import service
    _run(service.remove_limit, site, project_id=project_id, reason=reason)


@sites.command("group")
@click.argument("site")
@click.argument("keys", nargs=-1)
@_REASON
def group(site, keys, reason):
    """Make SITE one publisher of these KEYS (domains, DOI prefixes); no KEYS dissolves it."""
    from app.sites import service
    _run(service.set_group, site, list(keys), reason=reason)


@sites.command("pause")
@click.argument("site")
@click.option("--seconds", type=float, required=True, help="How long no worker starts its jobs.")
@click.option("--reason", required=True, help="Why (shown on the pages, kept in the audit log).")
def pause(site, seconds, reason):
    """Stop every worker from starting SITE's jobs for a while."""
    from app.sites import service
    _run(service.pause, site, seconds, reason=reason)


@sites.command("resume")
@click.argument("site")
@_REASON
def resume(site, reason):
    """End SITE's pause now."""
    from app.sites import service
    _run(service.resume, site, reason=reason)


@sites.command("rekey")
@click.option("--project", "project_id", default=None, help="Only this project's jobs.")
def rekey(project_id):
    """Give a site key to every job that has none and whose value names one
    (jobs enqueued before site keys existed, jobs imported from SavewebHQ)."""
    from app.sites.rekey import rekey as run
    emit(run(project_id))
