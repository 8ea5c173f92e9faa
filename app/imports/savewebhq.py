"""Switch from SavewebHQ: copy a SavewebHQ tracker database into FleetHQ.

One run reads the whole source from one snapshot into temporary tables of the
target session (``savewebhq_stage``), checks it (``savewebhq_checks``), then
writes users, machine tokens, projects, jobs with their attempts, the
worker map and the per-worker claim buckets set-based (``savewebhq_write``) and moves the job-id sequence past
the imported ids, all in one target transaction: a refused or failed run
writes nothing; a dry run does everything but write.

A run may be repeated while the old tracker still serves and once more
after it stops (a live switch): marks left by each run
(``savewebhq_marks``) tell what changed since in SavewebHQ, here, or both.
New rows and rows SavewebHQ changed (outcomes, receipts, leases, users,
tokens, policies) are brought over; what FleetHQ changed is never undone,
but a job SavewebHQ finished is finished here too. A run with nothing to
bring writes nothing and says so.

Not carried: web sessions (users sign in again), GitHub numeric ids and
avatars, and the dispatch token bucket (it starts full, as for a new
project). Claim buckets older than FleetHQ's retention are carried too and
pruned by the clock like its own.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from psycopg.conninfo import conninfo_to_dict

from app.errors import Conflict
from app.extensions import db
from app.imports import savewebhq_checks as checks
from app.imports import savewebhq_marks as marks
from app.imports import savewebhq_stage as stage
from app.imports import savewebhq_write as write

# One import at a time per target database.
_LOCK_KEY = 0x5A7E_4E70_1D9C

# Rows already in the target, for the tables without marks: the complement
# is "new".
_PRESENT = {
    "worker_users": "SELECT count(*) FROM sw_workers s WHERE EXISTS "
                    "(SELECT 1 FROM worker_users w WHERE w.worker_id = s.worker_id)",
    "claim_buckets": "SELECT count(*) FROM sw_claim_buckets s WHERE EXISTS (SELECT 1 FROM "
                     "worker_claim_buckets b WHERE (b.project_id, b.worker_id, b.bucket_started_at) "
                     "= (s.project_id, s.worker_id, s.bucket_started_at))",
}
_STAGE_OF = {"worker_users": "sw_workers", "claim_buckets": "sw_claim_buckets"}
# Claim buckets SavewebHQ counted further since the last run.
_BUCKETS_BEHIND = ("SELECT count(*) FROM sw_claim_buckets s JOIN worker_claim_buckets b "
                   "USING (project_id, worker_id, bucket_started_at) "
                   "WHERE (b.claim_requests, b.jobs_dispatched) < (s.claim_requests, s.jobs_dispatched)")


def _describe(url: str) -> str:
    try:
        info = conninfo_to_dict(url)
    except Exception:  # the connection attempt reports a bad URL properly
        return "?"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


def _read(src, tgt, totals, batch: int, say) -> None:
    for table in ("sw_users", "sw_projects", "sw_workers"):
        stage.copy_across(src, tgt, table)
    if totals.claim_buckets:
        stage.copy_across(src, tgt, "sw_claim_buckets")
    totals.tokens_plain_mismatch = stage.stage_tokens(src, tgt)
    say("read users, machine tokens, projects, the worker map and the claim buckets")
    staged = 0
    for lo, hi in stage.job_ranges(totals, batch):
        staged += stage.copy_across(src, tgt, "sw_jobs", lo=lo, hi=hi)
        say(f"read {staged}/{totals.jobs} jobs")
    tgt.execute("ANALYZE sw_users, sw_tokens, sw_projects, sw_workers, sw_claim_buckets, sw_jobs")


def _plan(tgt) -> dict:
    tables: dict[str, dict] = {}
    by_kind = marks.verdict_counts(tgt)
    for name, verdicts in by_kind.items():
        tables[name] = {"source": sum(verdicts.values()), "new": verdicts["new"],
                        "updated": verdicts["catch_up"] + verdicts["finished_there"],
                        "unchanged": verdicts["unchanged"] + verdicts["legacy"],
                        "kept_here": verdicts["kept_here"]}
    tables["jobs"]["finished_there"] = by_kind["jobs"]["finished_there"]
    for name, present_sql in _PRESENT.items():
        source = tgt.execute(f"SELECT count(*) FROM {_STAGE_OF[name]}").fetchone()[0]
        present = tgt.execute(present_sql).fetchone()[0]
        tables[name] = {"source": source, "new": source - present, "unchanged": present}
    behind = tgt.execute(_BUCKETS_BEHIND).fetchone()[0]
    tables["claim_buckets"].update(updated=behind, unchanged=tables["claim_buckets"]["unchanged"] - behind)
    revoked, viewable, legacy = tgt.execute(
        "SELECT count(*) FILTER (WHERE revoked), count(*) FILTER (WHERE NOT revoked AND viewable), "
        "count(*) FILTER (WHERE NOT revoked AND NOT viewable) FROM sw_tokens").fetchone()
    tables["machine_tokens"].update(revoked_not_carried=revoked, viewable=viewable,
                                    digest_only=legacy)
    tables["jobs"]["new_by_state"] = dict(tgt.execute(
        f"SELECT s.state, count(*) {write.NEW_JOBS} GROUP BY s.state ORDER BY 1").fetchall())
    planned = dict(tgt.execute(write.ATTEMPTS_PLANNED).fetchall())
    tables["attempts"] = {"new": sum(planned.values()), "new_by_state": planned}
    return tables


def _write(tgt, totals, batch: int, say, moving: int) -> list[str]:
    small = write.insert_small_tables(tgt)
    say(f"wrote {small['users']} users, {small['machine_tokens']} machine tokens "
        f"(removed {small['tokens_removed']} SavewebHQ rotated or revoked), {small['projects']} projects")
    done = moved = 0
    for lo, hi in stage.job_ranges(totals, batch):
        jobs, _ = write.insert_jobs(tgt, lo, hi)
        done += jobs
        moved += write.bring_over_jobs(tgt, lo, hi)[0] if moving else 0
        say(f"wrote {done} new jobs, brought {moved} jobs up to date")
    if moved != moving:
        # A job FleetHQ changed after the checks: deciding again is the safe way.
        raise Conflict(f"{moving - moved} jobs changed here while importing; nothing was written, "
                       "run the import again", code="import_conflict")
    write.insert_workers(tgt)
    write.insert_claim_buckets(tgt)
    marks.write_marks(tgt)
    return small["token_users"]


def _seal_tokens(user_ids: list[str], tokens: dict[str, str], say) -> tuple[int, list[str]]:
    """Make newly imported clear-text tokens viewable again, after the commit
    (the accounts service commits on its own)."""
    from app.accounts.service import install_token
    wanted = [u for u in user_ids if u in tokens]
    if not wanted:
        return 0, []
    sealed, problems = 0, []
    for user_id in wanted:
        try:
            install_token(user_id, tokens[user_id])
            sealed += 1
        except Exception as exc:  # the digest is in place; only viewing is lost
            db.session.rollback()
            problems.append(f"machine token of {user_id!r} works but is not viewable: {exc}")
    say(f"made {sealed} machine tokens viewable")
    return sealed, problems


def run(source_url: str, *, dry_run: bool = False, batch: int = 100_000,
        progress: Callable[[str], None] | None = None) -> dict:
    """Import (or, with ``dry_run``, only read and check) a SavewebHQ database.

    Parameters:
        source_url: a libpq URL of the SavewebHQ database (read only).
        batch: jobs per read and per insert statement.
        progress: called with one line per step.

    Returns:
        The summary: per table the source rows, the ``new`` ones (written, or
        to be written in a dry run) and the ``unchanged`` ones already here.

    Raises:
        InvalidRequest: ``invalid_source`` (unreachable, not SavewebHQ, rows
            FleetHQ cannot hold). Conflict: ``import_conflict``. Nothing is
            written in either case.
    """
    started = time.monotonic()

    def say(line: str) -> None:
        if progress is not None:
            progress(f"{line} ({time.monotonic() - started:.1f} s)")

    src = stage.open_source(source_url)
    try:
        stage.check_schema(src)
        totals = stage.totals(src)
        tgt = db.session.connection().connection.driver_connection
        tgt.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        stage.create_stages(tgt)
        marks.create_verdicts(tgt)
        _read(src, tgt, totals, batch, say)
        src.rollback()
        say("checking")
        marks.classify(tgt)
        checks.check_source(tgt)
        checks.check_conflicts(tgt)
        tables = _plan(tgt)
        warnings = checks.warnings(tgt, totals.tokens_plain_mismatch) + marks.kept_here_warnings(tgt)
        sequence = write.move_job_sequence(tgt, totals.max_job_id, write=False)
        changed = (any(t["new"] or t.get("updated") for t in tables.values())
                   or sequence["next_after"] != sequence["next_before"])
        adopting = marks.unmarked(tgt)
        viewable = dict(tgt.execute(
            "SELECT user_id, token FROM sw_tokens WHERE viewable AND NOT revoked").fetchall())
        token_users: list[str] = []
        if dry_run or not (changed or adopting):
            db.session.rollback()
        else:
            token_users = _write(tgt, totals, batch, say, tables["jobs"]["updated"])
            sequence = write.move_job_sequence(tgt, totals.max_job_id, write=True)
            db.session.commit()
            say("committed")
    except psycopg.IntegrityError as exc:
        # Only a writer racing the import gets here: the checks saw no conflict.
        db.session.rollback()
        raise Conflict("the target changed while importing; nothing was written, run the import "
                       f"again: {exc}".strip(), code="import_conflict") from None
    except BaseException:
        db.session.rollback()
        raise
    finally:
        src.close()
    sealed, problems = _seal_tokens(token_users, viewable, say)
    tables["machine_tokens"]["sealed"] = sealed
    if changed and not dry_run and tables["jobs"]["new"]:
        db.session.execute(db.text("ANALYZE jobs, attempts"))
        db.session.commit()
    if not changed:
        say("nothing to import: the target already holds every row of the source")
    return {"source": _describe(source_url), "dry_run": dry_run,
            "changed": changed and not dry_run, "up_to_date": not changed, "tables": tables,
            "jobs_id_sequence": sequence, "warnings": warnings + problems,
            "seconds": round(time.monotonic() - started, 3)}
