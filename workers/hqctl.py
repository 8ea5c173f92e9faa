"""``hqctl``: remote administration of a FleetHQ master over the machine API (DESIGN §6).

Settings: ``--master``/``FLEETHQ_MASTER`` and ``--token``/``--token-file``/
``FLEETHQ_TOKEN``. Results are JSON on stdout; errors are ``code: message``
on stderr. Exit codes: 0 ok, 1 failure, 2 usage.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from workers._cli_http import (ApiError, CliError, Client, Progress, UploadBody, UsageError,
                               resolve_settings, segment)
from workers.protocol import IDENTITY_MODES
from workers.source_cli import InputError, SpecInput, parse_args

# The master refuses enqueue bodies over 8 MiB (the margin covers the
# envelope) and batches over 10,000 jobs.
MAX_BATCH_BODY = 8 * 1024 * 1024 - 4096
MAX_BATCH_JOBS = 10_000
BATCH_TIMEOUT = 300.0
SOURCE_TIMEOUT = 3600.0  # the master answers a source import only when it is done


def _emit(obj) -> int:
    if obj:
        print(json.dumps(obj, ensure_ascii=False, indent=2 if sys.stdout.isatty() else None))
    return 0


def _project_path(args, *rest) -> str:
    return "/".join(["admin/projects", segment(args.project), *rest])


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

# field -> (parser, metavar). The master validates ranges; parsing here only
# turns text into the JSON type the field needs.
POLICY_FLAGS = {
    "status": (str, "active|draining|archived"), "claim_order": (str, "fifo|random"),
    "dispatch_qps": (_NULL_QPS, "QPS|null"), "worker_claim_qps": (_NULL_QPS, "QPS|null"),
    "max_jobs_per_claim": (int, "N"), "max_resets": (int, "N"),
    "recommended_lease_seconds": (int, "S"), "retry_backoff_seconds": (int, "S"),
    "upload_timeout_seconds": (int, "S"), "max_in_flight": (_NULL_INT, "N|null"),
    "max_worker_in_flight": (_NULL_INT, "N|null"), "task_timeout_seconds": (_NULL_INT, "S|null"),
    "attempt_timeout_seconds": (_NULL_INT, "S|null"), "prefer_new_worker": (_boolean, "true|false"),
}
CREATE_FLAGS = {"kind": (str, "generic|pdf"), "identity_mode": (str, "|".join(IDENTITY_MODES))}


def _add_policy_flags(parser, fields: dict) -> None:
    group = parser.add_argument_group("policy fields (DESIGN §5; omitted fields are not sent)")
    for name, (convert, metavar) in fields.items():
        # Both spellings, so that `--max-resets 5` and `--max_resets=5` work.
        flags = dict.fromkeys([f"--{name.replace('_', '-')}", f"--{name}"])
        group.add_argument(*flags, dest=name, type=convert, metavar=metavar,
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


# --- enqueue --------------------------------------------------------------------

def _should_retry(err: ApiError, mode: str) -> bool:
    """Whether resending a batch cannot create jobs twice, and may succeed."""
    if mode == "none":
        # Every submission makes new jobs, so resend only when the batch
        # surely was not applied: the master said so, or it was never reached.
        return (err.enveloped and err.retryable) if err.status is not None else not err.connected
    if err.status is None:
        return True
    return err.status == 429 or err.status >= 500 or err.retryable


def _backoff(attempt: int, hint_ms: int | None) -> float:
    delay = max(0.5 * 2 ** attempt, (hint_ms or 0) / 1000)
    return min(delay, 60.0) * random.uniform(1.0, 1.25)


def _post_batch(client, path: str, parts: list[bytes], mode: str, args) -> dict:
    body = b'{"jobs":[' + b",".join(parts) + b"]}"
    attempt = 0
    while True:
        try:
            return client.request("POST", path, data=body, timeout=args.timeout or BATCH_TIMEOUT,
                                  headers={"Content-Type": "application/json"})
        except ApiError as err:
            if attempt >= args.retries or not _should_retry(err, mode):
                raise
            time.sleep(_backoff(attempt, err.retry_after_ms))
            attempt += 1


def _fail_enqueue(err: dict, totals: dict, **extra) -> int:
    print(f"{err['code']}: {err['message']}", file=sys.stderr)
    print(json.dumps({"error": err, "committed": totals["submitted"], "inserted": totals["inserted"],
                      "batches": totals["batches"], **extra}, ensure_ascii=False), file=sys.stderr)
    return 1


def _open_specs(args, mode: str) -> SpecInput:
    default_ids = args.default_ids if args.default_ids is not None else mode == "external_id"
    if default_ids and mode != "external_id":
        raise UsageError(f"--default-ids only applies to external_id projects "
                         f"({args.project} is {mode})")
    return SpecInput(args.inputs, mode, jsonl=args.jsonl, default_ids=default_ids,
                     allow_random_key=True)


def cmd_enqueue(client, args):
    if not 1 <= args.batch_size <= MAX_BATCH_JOBS or args.retries < 0:
        raise UsageError(f"--batch-size must be 1..{MAX_BATCH_JOBS} and --retries >= 0")
    mode = client.request("GET", _project_path(args)).get("identity_mode")
    if mode not in IDENTITY_MODES:
        raise CliError(f"master reported an unknown identity mode {mode!r}")
    totals = {"submitted": 0, "inserted": 0, "batches": 0}
    specs = _open_specs(args, mode)
    if specs.rereadable:
        # Check every line before sending anything, so that a typo near the end
        # of a big file does not leave the project half-filled.
        try:
            for _ in specs:
                pass
        except InputError as exc:
            return _fail_enqueue({"code": "invalid_job", "message": str(exc)}, totals)
        specs = _open_specs(args, mode)
    progress = Progress(f"enqueue {args.project}", total=specs.total_bytes, enabled=args.progress)
    path = _project_path(args, "jobs")
    parts: list[bytes] = []
    wheres: list[str] = []
    size = 0

    def send() -> None:
        nonlocal size
        result = _post_batch(client, path, parts, mode, args)
        totals["submitted"] += int(result.get("submitted", len(parts)))
        totals["inserted"] += int(result.get("inserted", 0))
        totals["batches"] += 1
        parts.clear()
        wheres.clear()
        size = 0
        progress.update(specs.bytes_read, f"{totals['submitted']} jobs, {totals['inserted']} new",
                        force=True)

    try:
        try:
            for where, spec in specs:
                try:
                    part = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode()
                except UnicodeEncodeError:  # lone surrogates from \ud800 escapes
                    raise InputError(f"{where}: job is not valid UTF-8") from None
                if parts and (len(parts) >= args.batch_size or size + len(part) + 1 > MAX_BATCH_BODY):
                    send()
                parts.append(part)
                wheres.append(where)
                size += len(part) + 1
            if parts:
                send()
        finally:
            progress.close()
    except InputError as exc:
        return _fail_enqueue({"code": "invalid_job", "message": str(exc)}, totals)
    except ApiError as err:
        extra = {"failed_batch_starts_at": wheres[0]} if wheres else {}
        index = err.details.get("index")
        if isinstance(index, int) and 0 <= index < len(wheres):
            extra["failed_job_at"] = wheres[index]
        if err.status is None and err.connected and mode == "none":
            extra["note"] = ("the connection was lost after the batch was sent; it may have been "
                             "applied. Identity mode none never deduplicates: check the project "
                             "before resending from failed_batch_starts_at")
        return _fail_enqueue(err.envelope(), totals, **extra)
    return _emit(totals)


def cmd_enqueue_source(client, args):
    try:
        stream = open(args.file, "rb")
    except OSError as exc:
        raise CliError(f"{args.file}: {exc.strerror}") from None
    with stream:
        # A known size gives a Content-Length, so the upload is not chunked.
        size = os.fstat(stream.fileno()).st_size
        progress = Progress(f"upload {args.project}", total=size, enabled=args.progress)
        try:
            result = client.request("POST", _project_path(args, "source"),
                                    data=UploadBody(stream, size, progress),
                                    headers={"Content-Type": "application/zstd"},
                                    timeout=args.timeout or SOURCE_TIMEOUT)
        finally:
            progress.close()
    return _emit(result)


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
    return _emit(client.request("PUT", f"admin/users/{segment(args.user)}",
                                json={"roles": roles, "status": args.status}))


def cmd_token_rotate(client, args):
    result = client.request("POST", f"admin/users/{segment(args.user)}/machine-token")
    if args.json:
        return _emit(result)
    # Plain on stdout so that `hqctl token rotate u > token` just works.
    print(result.get("token", ""))
    print(f"hqctl: new machine token for {result.get('user_id', args.user)}; "
          "it is shown only this once", file=sys.stderr)
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
    group.add_argument("--master", metavar="URL", default=default,
                       help="master base URL (env FLEETHQ_MASTER)")
    group.add_argument("--token", default=default, help="machine token (env FLEETHQ_TOKEN)")
    group.add_argument("--token-file", metavar="PATH", default=default,
                       help="file holding the token (env FLEETHQ_TOKEN_FILE)")
    group.add_argument("--allow-http", action="store_true", default=default or False,
                       help="allow plain http to a non-loopback host")
    group.add_argument("--timeout", type=float, metavar="SECONDS", default=default,
                       help="read timeout per request")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hqctl", description="Administer a FleetHQ master.")
    _connection_flags(parser, None)
    # Connection flags are accepted after the subcommand too; SUPPRESS keeps
    # an absent one from hiding a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    _connection_flags(common, argparse.SUPPRESS)
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def leaf(group, name, func, help_text, *positionals):
        sub = group.add_parser(name, parents=[common], help=help_text, description=help_text)
        for positional in positionals:
            sub.add_argument(positional)
        sub.set_defaults(func=func)
        return sub

    def branch(name, help_text):
        return top.add_parser(name, help=help_text).add_subparsers(
            dest="action", required=True, metavar="ACTION")

    leaf(top, "whoami", _simple("GET", "whoami"), "show who the token belongs to")

    projects = branch("project", "get, list, create or change projects")
    leaf(projects, "get", _simple("GET", "admin/projects/{project}"), "show a project", "project")
    leaf(projects, "list", _simple("GET", "admin/projects"), "list projects")
    put = leaf(projects, "put", cmd_project_put, "create or replace a project (PUT)", "project")
    _add_policy_flags(put, {**CREATE_FLAGS, **POLICY_FLAGS})
    patch = leaf(projects, "set", cmd_project_set, "change some policy fields (PATCH)", "project")
    _add_policy_flags(patch, POLICY_FLAGS)
    leaf(projects, "delete", _simple("DELETE", "admin/projects/{project}"), "delete a project",
         "project")

    enqueue = leaf(top, "enqueue", cmd_enqueue, "add jobs from values or JSONL", "project")
    enqueue.add_argument("inputs", nargs="*", metavar="FILE", help="files; '-' or none: stdin")
    enqueue.add_argument("--jsonl", action="store_true", help="each line is a JobSpec object")
    enqueue.add_argument("--batch-size", type=int, default=1000,
                         help="jobs per request, 1..10000 (default 1000; bodies stay under 8 MiB)")
    enqueue.add_argument("--default-ids", action=argparse.BooleanOptionalAction, default=None,
                         help="fill missing ids with j1_ ids (default: on for external_id)")
    enqueue.add_argument("--retries", type=int, default=4,
                         help="resends of a batch after 429/5xx/network errors (default 4)")
    enqueue.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="progress bar on stderr (default: when stderr is a terminal)")
    source = leaf(top, "enqueue-source", cmd_enqueue_source, "import a .jsonl.zst source file",
                  "project", "file")
    source.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)

    jobs = branch("jobs", "list, show, requeue or delete jobs")
    listing = leaf(jobs, "list", cmd_jobs_list, "list jobs (cursor paging)", "project")
    listing.add_argument("--status")
    listing.add_argument("--after", metavar="JOB_ID", help="cursor: last job_id of previous page")
    listing.add_argument("--limit", type=int, help="1..200 (per page with --all)")
    listing.add_argument("--all", action="store_true",
                         help="follow the cursor to the end; one JSON job per line")
    job_path = "admin/projects/{project}/jobs/{job_id}"
    leaf(jobs, "show", _simple("GET", job_path), "show a job", "project", "job_id")
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
    rotate = leaf(tokens, "rotate", cmd_token_rotate, "issue a new token (printed once)", "user")
    rotate.add_argument("--json", action="store_true", help="print {user_id, token}")
    token_path = "admin/users/{user}/machine-token"
    leaf(tokens, "show", _simple("GET", token_path), "show token metadata", "user")
    leaf(tokens, "revoke", _simple("DELETE", token_path), "revoke the token", "user")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parse_args(parser, argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        master, token = resolve_settings(args.master, args.token, args.token_file)
        client = Client(master, token, allow_http=args.allow_http, timeout=args.timeout or 60.0)
        return args.func(client, args)
    except ApiError as err:
        print(err.line(), file=sys.stderr)
        return 1
    except (CliError, InputError) as err:
        print(f"hqctl: error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
