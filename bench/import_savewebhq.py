"""Import a SavewebHQ database of N jobs (default 1,000,000) with
``flask fleet import-savewebhq``; then run it again (nothing to do).

The source is a scratch database with the SavewebHQ schema of the tests,
filled set-based: three projects (one per identity mode), 100 users with
tokens, 200 workers, and jobs in every state (most done with an outcome and
a receipt, some failed or exhausted with an error, a few in flight).

Baseline, same run: PostgreSQL ``COPY`` of the rows the import wrote (jobs
and attempts, streamed out of the target) into tables like them with the
same indexes: what writing that much data costs without any import logic.

Last line: ``import_savewebhq jobs=N seconds=S jobs_per_s=R copy_seconds=C
ratio=S/C rerun_seconds=T``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import psycopg

from _common import BENCH_PG, ROOT, fresh_database

SCHEMA = os.path.join(ROOT, "tests", "savewebhq_schema.sql")

FILL_JOBS = """
INSERT INTO tracker_jobs (job_id, project_id, external_id, value, unique_value_digest, random_key,
    spec, status, attempt_id, worker_id, lease_expires_at, reset_count, outcome, artifact_receipts,
    execution_error, created_at, updated_at, completed_at)
OVERRIDING SYSTEM VALUE
SELECT i, p,
    CASE WHEN p = 'web' THEN 'j' || i END,
    v,
    CASE WHEN p = 'uniq' THEN sha256(convert_to(v, 'UTF8')) END,
    (i * 2654435761) %% 4294967296 - 2147483648,
    CASE WHEN i %% 7 = 0 THEN '{"type":"asset","via":"https://example.org/","hops":1}'::jsonb
         ELSE '{}'::jsonb END,
    s,
    CASE WHEN s = 'wip' THEN 'at_' || md5(i::text) END,
    CASE WHEN s = 'wip' THEN 'w' || (i %% 200) END,
    CASE WHEN s = 'wip' THEN %(now)s + 600 END,
    CASE WHEN s IN ('reset_exhausted') THEN 4 WHEN r = 9 THEN 1 ELSE 0 END,
    CASE WHEN s = 'done' THEN jsonb_build_object('kind', 'success', 'code', 200, 'uri', v,
                                                  'meta', '{}'::jsonb) END,
    CASE WHEN s = 'done' THEN jsonb_build_array(jsonb_build_object(
        'id', 'r' || i, 'issuer', 'warc.example.org', 'object_id', 's3://b/' || i || '.warc.gz',
        'checksum', 'sha256:' || md5(v) || md5(v), 'size_bytes', 1000 + i %% 5000,
        'accepted_at', %(now)s - 100)) END,
    CASE WHEN s IN ('failed', 'reset_exhausted') OR r = 9 THEN
        '{"code":"timeout","message":"read timed out","details":{}}'::jsonb END,
    %(t0)s + i / 100, %(t0)s + i / 100 + 60,
    CASE WHEN s IN ('done', 'failed', 'reset_exhausted') THEN %(t0)s + i / 100 + 60 END
FROM (
    SELECT i, r, CASE WHEN i %% 10 < 7 THEN 'web' WHEN i %% 10 < 9 THEN 'uniq' ELSE 'plain' END AS p,
           'https://example.org/page/' || i || '?from=savewebhq' AS v,
           CASE WHEN r < 5 THEN 'done' WHEN r < 7 THEN 'todo' WHEN r = 7 THEN 'failed'
                WHEN r = 8 AND i %% 2 = 0 THEN 'reset_exhausted' WHEN r = 9 THEN 'todo'
                WHEN r = 8 AND i %% 20 = 1 THEN 'wip' ELSE 'done' END AS s
    FROM (SELECT i, (i / 10) %% 10 AS r FROM generate_series(1, %(n)s) AS i) g
) j
"""


def fill_source(url: str, n: int) -> None:
    now = int(time.time())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(open(SCHEMA).read())
        conn.execute("INSERT INTO tracker_users (id, status, roles, created_at, updated_at) "
                     "SELECT 'user-' || u, 'active', '{worker}', %s, %s FROM generate_series(0, 99) u",
                     (now, now))
        conn.execute("INSERT INTO tracker_machine_tokens (user_id, token_hash, token, created_at) "
                     "SELECT 'user-' || u, sha256('\\x736176657765622d6d616368696e652d746f6b656e2d763100'::bytea "
                     "|| convert_to('hq_bench' || u, 'UTF8')), 'hq_bench' || u, %s "
                     "FROM generate_series(0, 99) u", (now,))
        conn.execute("INSERT INTO tracker_workers (worker_id, user_id) "
                     "SELECT 'w' || w, 'user-' || (w % 100) FROM generate_series(0, 199) w")
        conn.execute("INSERT INTO tracker_projects (id, status, identity_mode, claim_order, "
                     "created_at, updated_at) VALUES ('web', 'active', 'external_id', 'fifo', %(t)s, %(t)s), "
                     "('uniq', 'active', 'unique_value', 'random', %(t)s, %(t)s), "
                     "('plain', 'active', 'none', 'fifo', %(t)s, %(t)s)", {"t": now})
        conn.execute(FILL_JOBS, {"n": n, "now": now, "t0": now - 86400 * 30})
        conn.execute("ANALYZE")


def flask(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url, "FLEETHQ_LOG_JSON": "false"}
    return subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "fleet", *args],
                          cwd=ROOT, env=env, check=True, capture_output=True, text=True)


def copy_baseline(url: str) -> float:
    """Seconds to COPY the imported jobs and attempts into look-alike tables."""
    with psycopg.connect(url) as src, psycopg.connect(url) as dst:
        for table in ("jobs", "attempts"):
            dst.execute(f"CREATE TABLE copy_{table} (LIKE {table} INCLUDING DEFAULTS INCLUDING INDEXES)")
        dst.commit()
        started = time.perf_counter()
        for table in ("jobs", "attempts"):
            with src.cursor().copy(f"COPY {table} TO STDOUT") as out, \
                    dst.cursor().copy(f"COPY copy_{table} FROM STDIN") as inp:
                for block in out:
                    inp.write(block)
        dst.commit()
        return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()

    source = f"{BENCH_PG}/fleethq_bench_savewebhq_src"
    with psycopg.connect(f"{BENCH_PG}/postgres", autocommit=True) as conn:
        conn.execute('DROP DATABASE IF EXISTS "fleethq_bench_savewebhq_src" WITH (FORCE)')
        conn.execute('CREATE DATABASE "fleethq_bench_savewebhq_src"')
    started = time.perf_counter()
    fill_source(source, args.jobs)
    print(f"source: {args.jobs} jobs in {time.perf_counter() - started:.1f}s", flush=True)
    target = fresh_database("fleethq_bench_savewebhq")

    started = time.perf_counter()
    result = flask(target, "import-savewebhq", "--from-database-url", source)
    seconds = time.perf_counter() - started
    summary = json.loads(result.stdout)
    assert summary["tables"]["jobs"]["new"] == args.jobs, summary
    print(result.stderr.strip(), flush=True)
    print(f"import: {args.jobs} jobs, {summary['tables']['attempts']['new']} attempts "
          f"in {seconds:.1f}s", flush=True)

    started = time.perf_counter()
    again = json.loads(flask(target, "import-savewebhq", "--from-database-url", source).stdout)
    rerun = time.perf_counter() - started
    assert again["up_to_date"], again
    print(f"rerun (nothing to do): {rerun:.1f}s", flush=True)

    copy_seconds = copy_baseline(target)
    print(f"copy baseline: {copy_seconds:.1f}s", flush=True)
    print(f"import_savewebhq jobs={args.jobs} seconds={seconds:.1f} "
          f"jobs_per_s={args.jobs / seconds:.0f} copy_seconds={copy_seconds:.1f} "
          f"ratio={seconds / copy_seconds:.2f} rerun_seconds={rerun:.1f}")


if __name__ == "__main__":
    main()
