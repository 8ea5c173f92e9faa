"""Read a SavewebHQ database into temporary tables of the target session.

The source is read in one ``REPEATABLE READ READ ONLY`` transaction, so every
table comes from the same snapshot. Rows travel as ``COPY … TO STDOUT`` from
the source straight into ``COPY … FROM STDIN`` of a temporary table on the
target: no per-row Python work, whatever the number of jobs. The source
queries already translate SavewebHQ's representation (Unix seconds, the
``spec`` document, the worker map, millisecond claim buckets) into FleetHQ's
column types; the stage
tables vanish with the target transaction (``ON COMMIT DROP``).
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from app.accounts import tokens as fleet_tokens
from app.errors import InvalidRequest


REQUIRED_COLUMNS = {
    "tracker_users": ("id", "status", "roles", "github_login", "created_at", "updated_at"),
    "tracker_machine_tokens": ("user_id", "token_hash", "token", "created_at", "revoked_at"),
    "tracker_projects": ("id", "status", "identity_mode", "claim_order", "dispatch_qps",
                         "worker_claim_qps", "max_jobs_per_claim", "max_resets",
                         "recommended_lease_seconds", "client_versions", "policy_version",
                         "created_at", "updated_at"),
    "tracker_jobs": ("job_id", "project_id", "external_id", "value", "unique_value_digest",
                     "random_key", "spec", "status", "attempt_id", "worker_id",
                     "lease_expires_at", "reset_count", "outcome", "artifact_receipts",
                     "execution_error", "created_at", "updated_at", "completed_at"),
    "tracker_workers": ("worker_id", "user_id"),
}

_SORTED = "ARRAY(SELECT DISTINCT e FROM unnest({0}) AS e ORDER BY e)"

STAGES = {
    "sw_users": (
        "id text PRIMARY KEY, status text, roles text[], github_login text, "
        "created_at timestamptz, updated_at timestamptz",
        f"SELECT id, status, {_SORTED.format('roles')}, github_login, to_timestamp(created_at), "
        "to_timestamp(updated_at) FROM tracker_users"),
    "sw_projects": (
        "id text PRIMARY KEY, status text, identity_mode text, claim_order text, "
        "dispatch_qps float8, worker_claim_qps float8, max_jobs_per_claim int, max_resets int, "
        "recommended_lease_seconds bigint, client_versions text[], policy_version bigint, "
        "created_at timestamptz, updated_at timestamptz",
        "SELECT id, status, identity_mode, claim_order, dispatch_qps, worker_claim_qps, "
        "max_jobs_per_claim, max_resets, recommended_lease_seconds, "
        f"{_SORTED.format('client_versions')}, policy_version, to_timestamp(created_at), "
        "to_timestamp(updated_at) FROM tracker_projects"),
    "sw_workers": ("worker_id text PRIMARY KEY, user_id text",
                   "SELECT worker_id, user_id FROM tracker_workers"),
    # Read only when the source has the table (totals().claim_buckets > 0).
    "sw_claim_buckets": (
        "project_id text, worker_id text, bucket_started_at timestamptz, claim_requests bigint, "
        "jobs_dispatched bigint, policy_version bigint, "
        "PRIMARY KEY (project_id, worker_id, bucket_started_at)",
        "SELECT project_id, worker_id, to_timestamp(bucket_started_at_ms / 1000.0), claim_requests, "
        "jobs_dispatched, policy_version FROM tracker_worker_claim_buckets"),
    # hops stays text here so that a value beyond FleetHQ's int range is
    # reported by the checks instead of failing the COPY.
    "sw_jobs": (
        "id bigint PRIMARY KEY, project_id text, ext_id text, value_sha256 bytea, value text, "
        "type text, via text, hops text, attr jsonb, random_key int, state text, wire_id text, "
        "worker_id text, worker_owner text, lease_expires_at timestamptz, resets int, "
        "outcome jsonb, receipts jsonb, error jsonb, created_at timestamptz, "
        "updated_at timestamptz, completed_at timestamptz",
        "SELECT j.job_id, j.project_id, j.external_id, j.unique_value_digest, j.value, "
        "j.spec->>'type', j.spec->>'via', j.spec->>'hops', NULLIF(j.spec->'attr', 'null'), "
        "j.random_key, j.status, j.attempt_id, j.worker_id, w.user_id, "
        "to_timestamp(j.lease_expires_at), j.reset_count, j.outcome, "
        "NULLIF(j.artifact_receipts, 'null'), j.execution_error, to_timestamp(j.created_at), "
        "to_timestamp(j.updated_at), to_timestamp(j.completed_at) "
        "FROM tracker_jobs j LEFT JOIN tracker_workers w ON w.worker_id = j.worker_id "
        "WHERE j.job_id >= {lo} AND j.job_id < {hi}"),
}

_TOKENS_DDL = ("user_id text PRIMARY KEY, token_hash text, token text, viewable boolean, "
               "revoked boolean, created_at timestamptz")


@dataclass
class SourceTotals:
    jobs: int
    min_job_id: int
    max_job_id: int
    claim_buckets: int
    tokens_plain_mismatch: int = 0


def open_source(url: str) -> psycopg.Connection:
    """Connect to the SavewebHQ database: one read-only snapshot, UTC text times."""
    try:
        conn = psycopg.connect(url, connect_timeout=10)
    except psycopg.Error as exc:
        reason = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise InvalidRequest(f"cannot connect to the SavewebHQ database: {reason}",
                             code="invalid_source") from None
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET DateStyle = 'ISO, MDY'")
    conn.execute("SET extra_float_digits = 3")
    return conn


def check_schema(src: psycopg.Connection) -> None:
    rows = src.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ANY(%s)",
        [list(REQUIRED_COLUMNS)]).fetchall()
    present = {(t, c) for t, c in rows}
    missing = [f"{table}.{column}" for table, columns in REQUIRED_COLUMNS.items()
               for column in columns if (table, column) not in present]
    if missing:
        raise InvalidRequest(
            "not a SavewebHQ tracker database at its current schema (run its migrations first): "
            f"missing {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}",
            code="invalid_source", details={"missing": missing})


def totals(src: psycopg.Connection) -> SourceTotals:
    count, lo, hi = src.execute(
        "SELECT count(*), COALESCE(min(job_id), 1), COALESCE(max(job_id), 0) FROM tracker_jobs").fetchone()
    buckets = 0
    if src.execute("SELECT to_regclass('tracker_worker_claim_buckets') IS NOT NULL").fetchone()[0]:
        buckets = src.execute("SELECT count(*) FROM tracker_worker_claim_buckets").fetchone()[0]
    return SourceTotals(jobs=count, min_job_id=lo, max_job_id=hi, claim_buckets=buckets)


def create_stages(tgt: psycopg.Connection) -> None:
    for table, (columns, _) in STAGES.items():
        tgt.execute(f"CREATE TEMP TABLE {table} ({columns}) ON COMMIT DROP")
    tgt.execute(f"CREATE TEMP TABLE sw_tokens ({_TOKENS_DDL}) ON COMMIT DROP")


def copy_across(src: psycopg.Connection, tgt: psycopg.Connection, table: str, **bounds) -> int:
    """Stream one source query into its stage table; returns the rows copied."""
    query = STAGES[table][1]
    if bounds:
        query = sql.SQL(query).format(**{k: sql.Literal(v) for k, v in bounds.items()})
    else:
        query = sql.SQL(query)
    with src.cursor() as out_cur, tgt.cursor() as in_cur:
        with out_cur.copy(sql.SQL("COPY ({}) TO STDOUT").format(query)) as out, \
                in_cur.copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(table))) as inp:
            for block in out:
                inp.write(block)
        return in_cur.rowcount


def stage_tokens(src: psycopg.Connection, tgt: psycopg.Connection) -> int:
    """Stage machine tokens with the key FleetHQ will look each one up by.

    A token whose clear text SavewebHQ kept (and which matches its digest) gets
    FleetHQ's own digest and stays viewable; one known only by its SavewebHQ
    digest keeps that digest, tagged (``accounts.tokens.savewebhq_key_of``). Returns how many
    clear-text tokens did not match their digest (carried by the digest).
    """
    rows = src.execute(
        "SELECT user_id, token_hash, token, revoked_at IS NOT NULL, to_timestamp(created_at) "
        "FROM tracker_machine_tokens").fetchall()
    mismatched = 0
    with tgt.cursor() as cur, cur.copy("COPY sw_tokens (user_id, token_hash, token, viewable, "
                                       "revoked, created_at) FROM STDIN") as copy:
        for user_id, saveweb_digest, token, revoked, created_at in rows:
            viewable = token is not None and fleet_tokens.savewebhq_digest(token) == bytes(saveweb_digest)
            mismatched += token is not None and not viewable
            key = fleet_tokens.digest(token) if viewable else fleet_tokens.savewebhq_key_of(bytes(saveweb_digest))
            copy.write_row((user_id, key, token if viewable else None, viewable, revoked, created_at))
    return mismatched


def job_ranges(totals: SourceTotals, batch: int):
    """Half-open job-id ranges of about ``batch`` jobs each (ids may be sparse)."""
    if totals.jobs == 0:
        return
    span = totals.max_job_id - totals.min_job_id + 1
    parts = max(1, -(-totals.jobs // batch))
    step = -(-span // parts)
    for lo in range(totals.min_job_id, totals.max_job_id + 1, step):
        yield lo, min(lo + step, totals.max_job_id + 1)
