"""What each staged SavewebHQ row is to the target, so that an import can be
run again while the old tracker still serves and once more after it stops.

Every import leaves a mark per row it carried (``savewebhq_marks``): a
fingerprint of the source row it came from and one of the target row as it
left it. The next run compares both with what it finds now:

==============  ==============================================================
verdict         when
==============  ==============================================================
new             no mark and no row here: written
legacy          no mark but a row here (an import from before marks, or
                FleetHQ's own row): it must be equal (savewebhq_checks), and
                is then marked
unchanged       the source row is as it was last imported: nothing to do
catch_up        the source row changed and the row here is as the import left
                it: the source's row replaces it (a job is imported again,
                with the attempts its new state implies)
finished_there  (jobs) both changed, and the source finished the job (done,
                failed, reset_exhausted) while FleetHQ has not: the source's
                end is brought over and FleetHQ's running attempt, if any,
                ends as expired
kept_here       both changed otherwise, or the row was deleted here: FleetHQ's
                row (or its absence) is kept, and the summary says so
not_carried     (machine tokens) revoked in SavewebHQ, never carried here
==============  ==============================================================

A row changed by both sides is decided once: its mark takes the source's new
fingerprint, so only a further change in SavewebHQ brings it up again.
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg

TERMINAL = "('done', 'failed', 'reset_exhausted')"
WRITTEN = ("new", "legacy", "catch_up", "finished_there")
VERDICTS = ("new", "legacy", "unchanged", "catch_up", "finished_there", "kept_here", "not_carried")


@dataclass(frozen=True)
class Kind:
    """How one kind of row is keyed and fingerprinted on both sides."""
    name: str          # the mark's kind and the summary's table
    stage: str         # the stage table, alias ``s``
    key: str           # the mark's key, over ``s``
    target: str        # the target table and join, alias ``t``
    present: str       # true when the target row exists
    source_fp: str     # over ``s``
    target_fp: str     # over ``t`` (NULLs when the row is missing)
    first: str = "'new'"   # the verdict of a row with no mark and no row here
    extra: str = ""        # more WHEN … THEN … before kept_here


def _fp(expr: str) -> str:
    return f"CAST(md5(CAST(ROW({expr}) AS text)) AS uuid)"


JOB_FIELDS = "t.state, t.resets, t.current_attempt_id, t.lease_expires_at, t.updated_at, t.last_error"

KINDS = {
    "users": Kind(
        "users", "sw_users", "s.id", "users t ON t.id = s.id", "t.id IS NOT NULL",
        _fp("s.status, s.roles, s.github_login"), _fp("t.status, t.roles, t.github_login")),
    "machine_tokens": Kind(
        "machine_tokens", "sw_tokens", "s.user_id", "machine_tokens t ON t.user_id = s.user_id",
        "t.user_id IS NOT NULL", _fp("s.token_hash, s.revoked"), _fp("t.token_hash"),
        first="CASE WHEN s.revoked THEN 'not_carried' ELSE 'new' END"),
    "projects": Kind(
        "projects", "sw_projects", "s.id", "projects t ON t.id = s.id", "t.id IS NOT NULL",
        _fp("s.status, s.identity_mode, s.claim_order, s.dispatch_qps, s.worker_claim_qps, "
            "s.max_jobs_per_claim, s.max_resets, s.recommended_lease_seconds, s.client_versions, "
            "s.policy_version"),
        _fp("t.status, t.identity_mode, t.claim_order, t.dispatch_qps, t.worker_claim_qps, "
            "t.max_jobs_per_claim, t.max_resets, t.recommended_lease_seconds, t.client_versions, "
            "t.policy_version")),
    "jobs": Kind(
        "jobs", "sw_jobs", "CAST(s.id AS text)", "jobs t ON t.id = s.id", "t.id IS NOT NULL",
        "CAST(md5(CAST(s AS text)) AS uuid)", _fp(JOB_FIELDS),
        extra=f"WHEN s.state IN {TERMINAL} AND t.state NOT IN {TERMINAL} THEN 'finished_there'"),
}


def create_verdicts(tgt: psycopg.Connection) -> None:
    tgt.execute("CREATE TEMP TABLE sw_verdicts (kind text, key text, verdict text, "
                "PRIMARY KEY (kind, key)) ON COMMIT DROP")


def classify(tgt: psycopg.Connection) -> None:
    """Give every staged row its verdict (one statement per kind)."""
    for kind in KINDS.values():
        tgt.execute(f"""
            INSERT INTO sw_verdicts (kind, key, verdict)
            SELECT %(kind)s, {kind.key}, CASE
                WHEN m.key IS NULL THEN CASE WHEN {kind.present} THEN 'legacy' ELSE {kind.first} END
                WHEN m.source_fp = {kind.source_fp} THEN 'unchanged'
                WHEN m.target_fp = {kind.target_fp} THEN 'catch_up'
                {kind.extra}
                ELSE 'kept_here' END
            FROM {kind.stage} s LEFT JOIN {kind.target}
            LEFT JOIN savewebhq_marks m ON m.kind = %(kind)s AND m.key = {kind.key}""",
                    {"kind": kind.name})
    tgt.execute("ANALYZE sw_verdicts")


def verdict_counts(tgt: psycopg.Connection) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {name: dict.fromkeys(VERDICTS, 0) for name in KINDS}
    for kind, verdict, n in tgt.execute("SELECT kind, verdict, count(*) FROM sw_verdicts GROUP BY 1, 2"):
        counts[kind][verdict] = n
    return counts


def with_verdict(kind: str, verdicts: tuple[str, ...], key: str | None = None) -> str:
    """A condition on ``s``: its verdict is one of ``verdicts``."""
    names = ", ".join(f"'{v}'" for v in verdicts)
    return (f"EXISTS (SELECT 1 FROM sw_verdicts v WHERE v.kind = '{kind}' "
            f"AND v.key = {key or KINDS[kind].key} AND v.verdict IN ({names}))")


def write_marks(tgt: psycopg.Connection) -> None:
    """Mark what this run carried (and the source's side of what it kept)."""
    for kind in KINDS.values():
        tgt.execute(f"""
            INSERT INTO savewebhq_marks (kind, key, source_fp, target_fp)
            SELECT %(kind)s, v.key, {kind.source_fp}, {kind.target_fp}
            FROM sw_verdicts v JOIN {kind.stage} s ON {kind.key} = v.key LEFT JOIN {kind.target}
            WHERE v.kind = %(kind)s AND v.verdict IN ('new', 'legacy', 'catch_up', 'finished_there')
            ON CONFLICT (kind, key) DO UPDATE SET source_fp = EXCLUDED.source_fp,
                                                  target_fp = EXCLUDED.target_fp""",
                    {"kind": kind.name})
        tgt.execute(f"""
            UPDATE savewebhq_marks m SET source_fp = {kind.source_fp}
            FROM sw_verdicts v JOIN {kind.stage} s ON {kind.key} = v.key
            WHERE v.kind = %(kind)s AND v.verdict = 'kept_here'
              AND m.kind = v.kind AND m.key = v.key""", {"kind": kind.name})


def unmarked(tgt: psycopg.Connection) -> int:
    """Rows here and equal to the source but not marked yet (carried by a run
    from before marks): the run marks them, so that later changes are told apart."""
    return tgt.execute("SELECT count(*) FROM sw_verdicts WHERE verdict = 'legacy'").fetchone()[0]


def kept_here_warnings(tgt: psycopg.Connection, examples: int = 5) -> list[str]:
    """What changed on both sides and stays as FleetHQ has it, told to the operator."""
    out = []
    for kind, count, first in tgt.execute(
            "SELECT kind, count(*), (array_agg(key ORDER BY length(key), key))[1:%s] "
            "FROM sw_verdicts WHERE verdict = 'kept_here' GROUP BY kind ORDER BY kind", [examples]):
        out.append(f"{count} {kind.replace('_', ' ')} changed both in SavewebHQ and here (or were "
                   f"deleted here) since the last run; FleetHQ's are kept (first: {', '.join(first)})")
    return out
