"""``hqctl``: remote administration of a FleetHQ master over the machine API (DESIGN §6).

``hqctl enqueue`` and ``hqctl enqueue-source`` take SavewebHQ's hqctl command
lines unchanged (``workers.hqctl.enqueue``); the other commands are FleetHQ's.
Settings: ``--url``/``HQ_URL`` (or ``--master``/``FLEETHQ_MASTER``) and
``--machine-token-file``/``HQ_MACHINE_TOKEN_FILE`` (or ``--token``,
``--token-file``, ``FLEETHQ_TOKEN``, ``FLEETHQ_TOKEN_FILE``). Results are JSON
on stdout; errors go to stderr. Exit codes: 0 ok, 1 failure, 2 usage (1 for
``enqueue`` and ``enqueue-source``, as SavewebHQ's hqctl).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from workers.cli.args import SAVEWEBHQ_USAGE_EXIT, CliParser, duration, parse_args
from workers.cli.http import ApiError, CliError, Client, UsageError, resolve_settings, segment
from workers.hqctl.enqueue import (DEFAULT_BATCH_SIZE, DEFAULT_MAX_JOBS, DEFAULT_PROGRESS_EVERY,
                                   _emit, cmd_enqueue, cmd_enqueue_source)
from workers.wire.policy import CHOICE, FIELDS, INTEGER, RATE, SWITCH, VERSIONS, Field
from workers.cli.spec_input import InputError

DEFAULT_TIMEOUT = 600.0  # SavewebHQ's --timeout default, 10m


# FleetHQ's own admin routes carry its fuller views (kind, every policy field,
# staged counts, attempt history); SavewebHQ's routes answer its contract.
FLEETHQ_PROJECTS = "fleethq/projects"


def _project_path(args, *rest) -> str:
    return "/".join([FLEETHQ_PROJECTS, segment(args.project), *rest])


# --- policy flags (DESIGN §5) -------------------------------------------------

def _nullable(convert, name):
    def parse(text):
        return None if text == "null" else convert(text)
    parse.__name__ = name  # argparse shows it in "invalid ... value"
    return parse


def _boolean(text):
    if text.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return text.lower() in ("true", "yes", "1", "on")
    raise ValueError(text)


_boolean.__name__ = "boolean"
_NULL_INT, _NULL_QPS = _nullable(int, "integer or null"), _nullable(float, "number or null")

_PARSE = {CHOICE: str, INTEGER: int, RATE: _NULL_QPS, SWITCH: _boolean}


def _flag(field: Field):
    """(parser, metavar, help) of a policy field's flag. The master checks
    ranges; parsing here only turns text into the JSON type the field needs."""
    convert = _NULL_INT if field.type == INTEGER and field.nullable else _PARSE[field.type]
    return convert, field.metavar, field.hint


# client_versions is a repeatable flag of its own (_add_policy_flags).
POLICY_FLAGS = {f.name: _flag(f) for f in FIELDS if not f.fixed and f.type != VERSIONS}
CREATE_FLAGS = {f.name: _flag(f) for f in FIELDS if f.fixed}


def _add_policy_flags(parser, fields: dict) -> None:
    group = parser.add_argument_group("policy fields (DESIGN §5; omitted fields are not sent)")
    for name, (convert, metavar, hint) in fields.items():
        # Both spellings, so that `--max-resets 5` and `--max_resets=5` work.
        flags = dict.fromkeys([f"--{name.replace('_', '-')}", f"--{name}"])
        group.add_argument(*flags, dest=name, type=convert, metavar=metavar, help=hint,
                           default=argparse.SUPPRESS)
    group.add_argument("--client-versions", "--client_versions", dest="client_versions",
                       action="append", default=argparse.SUPPRESS, metavar="V[,V...]",
                       help="repeatable; an empty string sends [] (blocks every worker)")


def _policy_body(args, fields) -> dict:
    body = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    if hasattr(args, "client_versions"):
        body["client_versions"] = [v.strip() for item in args.client_versions
                                   for v in item.split(",") if v.strip()]
    return body


def cmd_project_put(client, args):
    body = _policy_body(args, {**CREATE_FLAGS, **POLICY_FLAGS})
    return _emit(client.request("PUT", _project_path(args), json=body))


def cmd_project_set(client, args):
    body = _policy_body(args, POLICY_FLAGS)
    if not body:
        raise UsageError("project set: give at least one field, e.g. --dispatch-qps 5")
    return _emit(client.request("PATCH", _project_path(args), json=body))


# --- jobs, users, tokens ----------------------------------------------------------

def cmd_jobs_list(client, args):
    params = {key: value for key, value in
              (("status", args.status), ("after_job_id", args.after), ("limit", args.limit))
              if value is not None}
    if not args.all:
        return _emit(client.request("GET", _project_path(args, "jobs"), params=params))
    # Every page, one job per line (JSON Lines), so that a million failed jobs
    # stream through `hqctl jobs list P --status failed --all | jq …`.
    params.setdefault("limit", 200)
    try:
        while True:
            page = client.request("GET", _project_path(args, "jobs"), params=params)
            for job in page.get("jobs", []):
                print(json.dumps(job, ensure_ascii=False))
            sys.stdout.flush()
            if not page.get("next_after_job_id"):
                return 0
            params["after_job_id"] = page["next_after_job_id"]
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def cmd_users_put(client, args):
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    # FleetHQ's route: it also takes the reader role, and answers the user.
    return _emit(client.request("PUT", f"fleethq/users/{segment(args.user)}",
                                json={"roles": roles, "status": args.status}))


def cmd_token_rotate(client, args):
    result = client.request("POST", f"admin/users/{segment(args.user)}/machine-token")
    if args.json:
        return _emit(result)
    # Plain on stdout so that `hqctl token rotate u > token` just works.
    print(result.get("token", ""))
    print(f"hqctl: new machine token for {result.get('user_id', args.user)} "
          "(`hqctl token show` shows it again where the master keeps tokens viewable)",
          file=sys.stderr)
    return 0


def _simple(method: str, template: str):
    """A command that is one request whose answer is printed as is."""
    def run(client, args):
        path = template.format(**{k: segment(v) for k, v in vars(args).items()
                                  if isinstance(v, str)})
        return _emit(client.request(method, path))
    return run


# --- argument parsing ---------------------------------------------------------------

def _connection_flags(parser, default):
    group = parser.add_argument_group("connection")
    group.add_argument("--url", "--master", dest="master", metavar="URL", default=default,
                       help="master base URL (env HQ_URL or FLEETHQ_MASTER; no default)")
    group.add_argument("--machine-token-file", "--token-file", dest="token_file", metavar="PATH",
                       default=default, help="file holding the token, mode 0600 "
                                             "(env HQ_MACHINE_TOKEN_FILE or FLEETHQ_TOKEN_FILE)")
    group.add_argument("--token", default=default, help="machine token (env FLEETHQ_TOKEN)")
    group.add_argument("--allow-http", action="store_true", default=default or False,
                       help="allow plain http to a non-loopback host")
    group.add_argument("--timeout", type=duration, metavar="DURATION", default=default,
                       help="longest wait for an answer: 10m (default), 30s, 1h30m, ...")


def _enqueue_flags(enqueue) -> None:
    enqueue.add_argument("inputs", nargs="*", metavar="ARG",
                         help="FleetHQ's positional form: the project (unless --project-id), "
                              "then files")
    enqueue.add_argument("--project-id", metavar="P", help="target project")
    enqueue.add_argument("--input", action="append", metavar="FILE",
                         help="input file, '-' for stdin (the default); repeatable")
    enqueue.add_argument("--format", choices=("values", "jsonl"), default="values",
                         help="values: one exact value per line (default); jsonl: one job a line")
    enqueue.add_argument("--jsonl", dest="format", action="store_const", const="jsonl",
                         help="same as --format jsonl")
    enqueue.add_argument("--type", choices=("seed", "asset"),
                         help="job type of values input (default seed)")
    enqueue.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, metavar="N",
                         help=f"jobs per request, any positive count (default "
                              f"{DEFAULT_BATCH_SIZE}); a body is cut before 8 MiB")
    enqueue.add_argument("--max-jobs", type=int, default=DEFAULT_MAX_JOBS, metavar="N",
                         help=f"most input jobs (default {DEFAULT_MAX_JOBS})")
    enqueue.add_argument("--progress-every", type=int, default=DEFAULT_PROGRESS_EVERY,
                         metavar="N", help=f"a progress line on stderr every N batches "
                                           f"(default {DEFAULT_PROGRESS_EVERY}; 0: never)")
    enqueue.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="a progress bar instead of the lines (the default when stderr is a terminal); "
                              "--no-progress: neither")
    enqueue.add_argument("--default-ids", action=argparse.BooleanOptionalAction, default=None,
                         help="fill missing ids with j1_ ids (default: on for external_id)")
    enqueue.add_argument("--retries", type=int, default=4,
                         help="resends of a batch after 429/5xx/network errors (default 4)")


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="hqctl", description="Administer a FleetHQ master.")
    _connection_flags(parser, None)
    # Connection flags are accepted after the subcommand too; SUPPRESS keeps
    # an absent one from hiding a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    _connection_flags(common, argparse.SUPPRESS)
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def leaf(group, name, func, help_text, *positionals, **options):
        sub = group.add_parser(name, parents=[common], help=help_text, description=help_text,
                               **options)
        for positional in positionals:
            sub.add_argument(positional)
        sub.set_defaults(func=func, parser=sub)
        return sub

    def branch(name, help_text):
        return top.add_parser(name, help=help_text).add_subparsers(
            dest="action", required=True, metavar="ACTION")

    leaf(top, "whoami", _simple("GET", "whoami"), "show who the token belongs to")

    projects = branch("project", "get, list, create or change projects")
    leaf(projects, "get", _simple("GET", FLEETHQ_PROJECTS + "/{project}"), "show a project",
         "project")
    leaf(projects, "list", _simple("GET", FLEETHQ_PROJECTS), "list projects")
    put = leaf(projects, "put", cmd_project_put, "create or replace a project (PUT)", "project")
    _add_policy_flags(put, {**CREATE_FLAGS, **POLICY_FLAGS})
    patch = leaf(projects, "set", cmd_project_set, "change some policy fields (PATCH)", "project")
    _add_policy_flags(patch, POLICY_FLAGS)
    leaf(projects, "delete", _simple("DELETE", "admin/projects/{project}"), "delete a project",
         "project")

    enqueue = leaf(top, "enqueue", cmd_enqueue, "add jobs from values or JSONL, in batches",
                   usage_exit=SAVEWEBHQ_USAGE_EXIT)
    _enqueue_flags(enqueue)
    source = leaf(top, "enqueue-source", cmd_enqueue_source,
                  "import a jobs-jsonl-zstd-v1 source file in one streamed request",
                  usage_exit=SAVEWEBHQ_USAGE_EXIT)
    source.add_argument("inputs", nargs="*", metavar="ARG",
                        help="FleetHQ's positional form: the project (unless --project-id), "
                             "then the file")
    source.add_argument("--project-id", metavar="P", help="target project")
    source.add_argument("--input", action="append", metavar="FILE",
                        help="the source file, '-' for stdin")
    source.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="upload progress bar (default: when stderr is a terminal)")

    jobs = branch("jobs", "list, show, requeue or delete jobs")
    listing = leaf(jobs, "list", cmd_jobs_list, "list jobs (cursor paging)", "project")
    listing.add_argument("--status")
    listing.add_argument("--after", metavar="JOB_ID", help="cursor: last job_id of previous page")
    listing.add_argument("--limit", type=int, help="1..200 (per page with --all)")
    listing.add_argument("--all", action="store_true",
                         help="follow the cursor to the end; one JSON job per line")
    job_path = "admin/projects/{project}/jobs/{job_id}"
    leaf(jobs, "show", _simple("GET", FLEETHQ_PROJECTS + "/{project}/jobs/{job_id}"),
         "show a job with its attempt history", "project", "job_id")
    leaf(jobs, "requeue", _simple("POST", job_path + "/requeue"),
         "requeue a failed or reset_exhausted job", "project", "job_id")
    leaf(jobs, "delete", _simple("DELETE", job_path), "delete a job", "project", "job_id")

    users = branch("users", "list, create or delete users")
    leaf(users, "list", _simple("GET", "admin/users"), "list users")
    user_put = leaf(users, "put", cmd_users_put, "create or replace a user", "user")
    user_put.add_argument("--roles", required=True, help="comma list: admin,worker,reader")
    user_put.add_argument("--status", default="active", help="default active")
    leaf(users, "delete", _simple("DELETE", "admin/users/{user}"), "delete a user", "user")

    tokens = branch("token", "rotate, show or revoke a user's machine token")
    rotate = leaf(tokens, "rotate", cmd_token_rotate, "issue a new token", "user")
    rotate.add_argument("--json", action="store_true", help="print {user_id, token}")
    token_path = "admin/users/{user}/machine-token"
    leaf(tokens, "show", _simple("GET", token_path), "show the user's current token", "user")
    leaf(tokens, "revoke", _simple("DELETE", token_path), "revoke the token", "user")
    return parser


def _client(args) -> Client:
    timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    if timeout <= 0:
        raise UsageError("--timeout must be positive")
    master, token = resolve_settings(args.master, args.token, args.token_file)
    return Client(master, token, allow_http=args.allow_http, timeout=timeout)


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return args.func(_client(args), args)
    except ApiError as err:
        print(err.line(), file=sys.stderr)
        return 1
    except (CliError, InputError) as err:
        print(f"hqctl: error: {err}", file=sys.stderr)
        if isinstance(err, UsageError):
            return args.parser.usage_exit
        return 1
    except KeyboardInterrupt:
        return 130
