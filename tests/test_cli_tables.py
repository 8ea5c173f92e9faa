"""``flask fleet`` list commands (issue "The first day of an operator"): a
table for a person at a terminal, the same JSON as always with ``--json`` or
whenever output is not a terminal (scripts keep working), times in the
computer's zone."""
from __future__ import annotations

import json
import re

from tests.helpers import Api, body


def fleet(app, *args) -> str:
    result = app.test_cli_runner().invoke(args=["fleet", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_projects_print_a_table_or_json(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("tabled")
    api.enqueue("tabled", [{"id": f"t{i}", "value": f"https://example.org/{i}"} for i in range(3)])
    body(api.claim("tabled", max_jobs=1))
    table = fleet(app, "projects", "--table").splitlines()
    assert table[0].split() == ["PROJECT", "KIND", "STATUS", "TODO", "WIP", "STAGED", "DONE", "FAILED",
                                "RESET_EXHAUSTED", "TOTAL"]
    assert table[1].split() == ["tabled", "generic", "active", "2", "1", "0", "0", "0", "0", "3"]
    # Numbers line up on the right under their headers.
    assert table[0].index("TOTAL") + len("TOTAL") == len(table[1])
    # Not a terminal (a pipe, a script): JSON as before; --json says so on a terminal.
    for output in (fleet(app, "projects"), fleet(app, "projects", "--json")):
        [project] = json.loads(output)
        assert project["id"] == "tabled" and project["job_counts"]["todo"] == 2


def test_users_and_workers_tables_name_times_in_the_local_zone(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("seen")
    api.enqueue("seen", [{"id": "s1", "value": "https://example.org/s"}])
    body(api.claim("seen", max_jobs=1, worker_id="sdk-worker-1"))
    users = fleet(app, "users", "--table").splitlines()
    assert users[0].split() == ["USER", "STATUS", "ROLES", "TOKEN", "CREATED"]
    admin = next(line for line in users if line.startswith("admin "))
    assert "admin,worker" in admin and " yes " in admin
    assert re.search(r" \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z][A-Za-z0-9+-]*$", admin), admin  # the zone named
    workers = fleet(app, "workers", "--table").splitlines()
    assert workers[0].split()[:4] == ["KIND", "WORKER", "USER", "STATUS"]
    token = next(line for line in workers if "sdk-worker-1" in line)
    # An SDK worker never heartbeats by design: "none", not stale.
    assert token.split()[:4] == ["token", "sdk-worker-1", "admin", "active"] and "none" in token
    assert "STALE" not in token
    assert json.loads(fleet(app, "workers", "--json"))[0]["worker_id"] == "sdk-worker-1"
    assert fleet(app, "held", "--table").strip() == "(no held files)"
    assert fleet(app, "sites", "list", "--table").startswith("Limits:\n(none)")
