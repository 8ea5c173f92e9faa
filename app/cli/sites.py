"""``flask fleet sites …``: the publishers the fleet fetches from (app.sites)."""
from __future__ import annotations

import click

from app.cli.group import emit, fleet


@fleet.group("sites")
def sites():
    """Site keys and the fleet's politeness towards each site."""


@sites.command("rekey")
@click.option("--project", "project_id", default=None, help="Only this project's jobs.")
def rekey(project_id):
    """Give a site key to every job that has none and whose value names one
    (jobs enqueued before site keys existed, jobs imported from SavewebHQ)."""
    from app.sites.rekey import rekey as run
    emit(run(project_id))
