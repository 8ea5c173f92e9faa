"""The project policy is declared once (workers.wire.policy): the master's
checks, its API document, the admin page's form, ``flask fleet put-project``
and ``hqctl project put/set`` all take their fields from it and agree on
every range."""
from __future__ import annotations

import html
import re

import pytest

from app.errors import InvalidRequest
from app.projects import policy
from workers.wire.policy import CHOICE, FIELDS, INTEGER, PROJECT_KINDS, RATE, SWITCH, VERSIONS
from workers.wire.protocol import INT32_MAX

NAMES = [field.name for field in FIELDS]


def _accepts(name, value) -> bool:
    try:
        policy.RULES[name](name, value)
    except InvalidRequest:
        return False
    return True


@pytest.mark.parametrize("field", FIELDS, ids=NAMES)
def test_the_master_checks_each_field_by_its_declaration(field):
    nulls = field.nullable or field.type == RATE
    assert _accepts(field.name, None) is nulls
    if field.type == INTEGER:
        assert _accepts(field.name, field.lo) and _accepts(field.name, field.hi)
        assert not _accepts(field.name, field.lo - 1) and not _accepts(field.name, field.hi + 1)
        assert not _accepts(field.name, 1.5) and not _accepts(field.name, True)
    elif field.type == CHOICE:
        assert all(_accepts(field.name, choice) for choice in field.choices)
        assert not _accepts(field.name, "something-else")
    elif field.type == RATE:
        assert _accepts(field.name, 0.5) and not _accepts(field.name, 0)
        assert not _accepts(field.name, float("inf"))
    elif field.type == SWITCH:
        assert _accepts(field.name, False) and not _accepts(field.name, "yes")
    elif field.type == VERSIONS:
        assert _accepts(field.name, ["w/1"]) and not _accepts(field.name, ["w/1", "w/1"])
    assert (field.name in policy.VERSIONED_FIELDS) is field.versioned
    assert (field.name in policy.FIXED_FIELDS) is field.fixed


def test_every_field_has_a_default_for_every_kind_that_passes_its_check():
    for kind in PROJECT_KINDS:
        defaults = policy.defaults(kind)
        assert list(defaults) == NAMES
        assert policy.validate_fields(defaults) == {**defaults, "client_versions": []}


def test_the_api_document_publishes_the_same_ranges(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    properties = doc["components"]["schemas"]["FleetHQProjectPolicy"]["properties"]
    assert list(properties) == NAMES
    for field in FIELDS:
        schema = properties[field.name]
        kinds = schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds or []
        if field.type == INTEGER:
            assert (schema["minimum"], schema["maximum"]) == (field.lo, field.hi), field.name
            assert ("null" in kinds) is field.nullable, field.name
        elif field.type == CHOICE:
            assert schema["enum"] == list(field.choices), field.name
        elif field.type == RATE:
            assert schema["exclusiveMinimum"] == 0 and "null" in kinds, field.name
        elif field.type == SWITCH:
            assert kinds == ["boolean"], field.name
        if field.help:
            assert field.help in schema["description"], field.name


def test_the_policy_form_has_a_box_for_every_field_that_can_change(pages, api):
    api.call("PUT", "/api/v1/fleethq/projects/formed", {"kind": "pdf", "client_versions": ["w/1"]})
    page = pages.text("/admin/projects/formed")
    for field in FIELDS:
        shown = f'name="{field.name}"' in page
        assert shown is not field.fixed, field.name
        if field.type in (INTEGER, RATE):
            # The box says what it takes: the declared range, and what it means.
            box = html.unescape(re.search(rf'<input[^>]*name="{field.name}"[^>]*>', page).group(0))
            assert f'placeholder="{field.range_text}"' in box and f'title="{field.summary}"' in box, box


def test_flask_fleet_put_project_has_a_flag_for_every_field():
    from app.cli.projects import put_project
    options = {param.name: param for param in put_project.params}
    for field in FIELDS:
        assert field.name in options, field.name
        assert field.range_text in options[field.name].help, field.name


def test_hqctl_has_a_flag_for_every_field():
    from workers.hqctl.main import build_parser
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices["project"]._subparsers \
        ._group_actions[0].choices
    put_flags = {a.dest: a for a in commands["put"]._actions}
    set_flags = {a.dest: a for a in commands["set"]._actions}
    for field in FIELDS:
        assert field.name in put_flags, field.name
        assert (field.name in set_flags) is not field.fixed, field.name
    # hqctl turns the text into the JSON type; the range is the master's to check.
    args = parser.parse_args(["project", "set", "p", "--max-worker-attempts", "null",
                              "--dispatch-qps", "2.5", "--prefer-new-worker", "false",
                              "--max-resets", "4", "--client-versions", "a/1,b/2"])
    assert (args.max_worker_attempts, args.dispatch_qps, args.prefer_new_worker, args.max_resets,
            args.client_versions) == (None, 2.5, False, 4, ["a/1,b/2"])


def test_a_range_that_runs_to_the_integer_limit_reads_as_a_lower_bound():
    by_name = {field.name: field for field in FIELDS}
    assert by_name["task_timeout_seconds"].hi == INT32_MAX
    assert by_name["task_timeout_seconds"].range_text == "null or ≥ 60"
    assert by_name["max_jobs_per_claim"].range_text == "1..256"
