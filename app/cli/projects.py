"""``flask fleet`` projects: put-project (SavewebHQ's ``tracker put-project``
flags, parsed as tracker parses them), projects, enqueue-source."""
from __future__ import annotations

import json
import os
import stat

import click

from app.cli.group import database_url_option, emit, fail, fleet
from app.cli.tables import Column, answer, json_option, key
from app.errors import FleetError, InvalidRequest
from app.projects.models import JOB_STATES


def _policy_options(fn):
    from workers.wire.policy import FIELDS
    for field in reversed(FIELDS):
        fn = click.option(f"--{field.name.replace('_', '-')}", field.name, default=None,
                          help=_flag_help(field))(fn)
    return fn


def _flag_help(field) -> str:
    """How the value is written (tracker's parsing for its flags, JSON for
    FleetHQ's own), the default when every kind shares one, the range and
    what the field means."""
    from app.projects.models import PROJECT_KINDS
    from app.projects.policy import defaults
    tracker = field.name in _PARSERS
    parts = [_TRACKER_SYNTAX.get(field.name, "") if tracker else "JSON value (null clears)"]
    shared = {repr(defaults(kind)[field.name]) for kind in PROJECT_KINDS}
    if len(shared) == 1 and not field.fixed and field.type != "versions":
        value = defaults(PROJECT_KINDS[0])[field.name]
        parts.append(f"default {'no limit' if value is None else value}")
    return "; ".join(p for p in parts if p) + f"; {field.range_text}: {field.help or field.summary}"


# How SavewebHQ's tracker flags are written (their parsing is tracker's).
_TRACKER_SYNTAX = {
    "kind": "fixed at creation", "identity_mode": "fixed at creation",
    "claim_order": "kept when omitted",
    "dispatch_qps": "empty means unlimited", "worker_claim_qps": "empty means unlimited",
    "max_jobs_per_claim": "0 means 256",
    "client_versions": "comma-separated",
}


def _text(raw: str):
    return raw


def _rate(raw: str):
    """tracker's QPS flags: empty (or FleetHQ's ``null``) means unlimited."""
    text = raw.strip()
    if text in ("", "null"):
        return None
    try:
        return float(text)
    except ValueError:
        return raw  # the policy check names the field and its range


def _integer(raw: str):
    try:
        return int(raw.strip())
    except ValueError:
        return raw


def _claim_batch(raw: str):
    value = _integer(raw)
    return 256 if value == 0 else value  # tracker: 0 means the largest batch


def _client_versions(raw: str):
    """tracker's parsing: comma-separated, each entry trimmed; empty means none."""
    if raw == "":
        return []
    versions = [v.strip() for v in raw.split(",")]
    if len(set(versions)) != len(versions):
        raise InvalidRequest("client_versions entries must be unique",
                             details={"field": "client_versions"})
    return versions


# SavewebHQ's tracker flags parse their values as tracker does; FleetHQ's own
# fields take JSON values (null clears a nullable one).
_PARSERS = {
    "kind": _text, "status": _text, "identity_mode": _text, "claim_order": _text,
    "dispatch_qps": _rate, "worker_claim_qps": _rate,
    "max_jobs_per_claim": _claim_batch, "max_resets": _integer,
    "recommended_lease_seconds": _integer, "client_versions": _client_versions,
}
# tracker put-project always sets these (their defaults when a flag is
# omitted) and leaves every other field of an existing project as it is.
_TRACKER_FIELDS = ("status", "dispatch_qps", "worker_claim_qps", "max_jobs_per_claim",
                   "max_resets", "recommended_lease_seconds", "client_versions")


def _parse_policy(values: dict) -> dict:
    fields = {}
    for name, raw in values.items():
        if raw is None or (raw == "" and name in ("identity_mode", "claim_order")):
            continue  # not given; tracker: an empty mode or order means the default
        parser = _PARSERS.get(name)
        if parser is not None:
            fields[name] = parser(raw)
            continue
        try:
            fields[name] = json.loads(raw)
        except ValueError:
            raise InvalidRequest(f"{name} must be a JSON value", details={"field": name}) from None
    return fields


def _one_value(name: str, positional, flag):
    if positional is not None and flag is not None and positional != flag:
        raise click.UsageError(f"give the {name} once (argument or flag)")
    value = flag if flag is not None else positional
    if value is None:
        raise click.UsageError(f"the {name} is required")
    return value


@fleet.command("put-project")
@database_url_option
@click.argument("project_id", required=False)
@click.option("--project-id", "project_id_flag", default=None, metavar="P",
              help="Project identifier (or give it as the argument).")
@click.option("--patch", is_flag=True, help="Change only the given fields.")
@_policy_options
def put_project(project_id, project_id_flag, patch, **values):
    """Create a project or change its policy (SavewebHQ's tracker put-project).

    Without --patch, an existing project gets the given fields, tracker's
    defaults for its omitted ones (status, both QPS, max jobs per claim, max
    resets, lease, client versions), and keeps everything else (claim order,
    FleetHQ's scheduling fields).
    """
    from app.errors import NotFound
    from app.projects import policy, service
    project_id = _one_value("project ID (--project-id)", project_id, project_id_flag)
    try:
        fields = _parse_policy(values)
        partial = patch
        if not patch:
            try:
                kind = service.view(project_id).kind
            except NotFound:
                kind = None
            if kind is not None:
                defaults = policy.defaults(kind)
                fields = {**{name: defaults[name] for name in _TRACKER_FIELDS}, **fields}
                partial = True
        project, created = service.put(project_id, fields, partial=partial)
        emit({"created": created, **service.summary(project)})
    except FleetError as exc:
        fail(exc)


def _count(state: str) -> Column:
    return Column(state.upper(), lambda p: p["job_counts"].get(state, 0), right=True)


PROJECT_COLUMNS = [key("id", "PROJECT"), key("kind"), key("status"),
                   *(_count(s) for s in JOB_STATES),
                   Column("TOTAL", lambda p: sum(p["job_counts"].values()), right=True)]


@fleet.command("projects")
@json_option
def list_projects(as_json):
    """List projects with their job counts."""
    from app.projects import service
    answer(service.list_summaries(), PROJECT_COLUMNS, as_json, empty="(no projects)")


class _ReadProgress:
    """The source file as the import reads it, drawing hqctl's progress bar
    (share of the file read, elapsed, ETA) on stderr when it is a terminal."""

    def __init__(self, stream, label: str):
        from workers.cli.http import Progress
        self.stream = stream
        try:
            info = os.fstat(stream.fileno())
            size = info.st_size if stat.S_ISREG(info.st_mode) else None  # a pipe has no size
        except (OSError, AttributeError, ValueError):  # CliRunner's in-memory stdin
            size = None
        self.bar = Progress(label, total=size or None)
        self.done = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.done += len(data)
        self.bar.update(self.done, f"{self.done / (1 << 20):.1f} MiB read")
        return data

    def close_bar(self) -> None:
        self.bar.update(self.done, f"{self.done / (1 << 20):.1f} MiB read", force=True)
        self.bar.close()

    def __getattr__(self, name):
        return getattr(self.stream, name)


# A local import reads a file the operator chose: tracker's limits, not the
# HTTP route's (SOURCE_MAX_*).
SOURCE_CLI_MAX_BYTES = 1 << 40
SOURCE_CLI_MAX_JOBS = 100_000_000


@fleet.command("enqueue-source")
@database_url_option
@click.argument("project_id", required=False)
@click.argument("source", type=click.File("rb"), required=False)
@click.option("--project-id", "project_id_flag", default=None, metavar="P",
              help="Existing project (or give it as the first argument).")
@click.option("--input", "input_file", type=click.File("rb"), default=None, metavar="FILE",
              help="jobs-jsonl-zstd-v1 source file, - for stdin (or the second argument).")
@click.option("--max-jobs", type=click.IntRange(min=1), default=SOURCE_CLI_MAX_JOBS,
              show_default=True, help="Stop with too_large past this many jobs.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Jobs per commit (default SOURCE_BATCH).")
def enqueue_source(project_id, source, project_id_flag, input_file, max_jobs, batch_size):
    """Import a jobs-jsonl-zstd-v1 file (streamed, committed in batches)."""
    from flask import current_app

    from app.projects import source_import
    from workers.wire.source import Limits
    project_id = _one_value("project ID (--project-id)", project_id, project_id_flag)
    if source is not None and input_file is not None:
        raise click.UsageError("give the source file once (argument or --input)")
    stream = input_file or source
    if stream is None:
        raise click.UsageError("the source file (--input) is required")
    cfg = current_app.config
    limits = Limits(max_compressed=SOURCE_CLI_MAX_BYTES, max_expanded=SOURCE_CLI_MAX_BYTES,
                    max_jobs=max_jobs, max_line=cfg["SOURCE_MAX_LINE"],
                    max_window=cfg["SOURCE_MAX_WINDOW"])
    reading = _ReadProgress(stream, f"enqueue-source {project_id}")
    try:
        result = source_import.import_source(project_id, reading, limits=limits,
                                             batch_size=batch_size or cfg["SOURCE_BATCH"])
    except FleetError as exc:
        reading.close_bar()
        fail(exc)
    reading.close_bar()
    emit({"project_id": project_id, "jobs": result.jobs, "inserted": result.inserted,
           "uncompressed_bytes": result.uncompressed_bytes})
