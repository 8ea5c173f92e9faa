"""A SavewebHQ tracker database with realistic rows, for the import tests.

``fill(url)`` creates the schema of ``savewebhq_schema.sql`` in an empty
database and writes users with every kind of machine token, three projects
(one per identity mode), jobs in every state (receipts, execution errors,
in-flight leases, sparse ids, plus a bulk of generated jobs), the worker map,
claim buckets and a web session. It returns what the tests need to know.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field

import psycopg

SCHEMA = os.path.join(os.path.dirname(__file__), "savewebhq_schema.sql")
VERSION = "saveweb-1.3.0"


def saveweb_digest(token: str) -> bytes:
    return hashlib.sha256(b"saveweb-machine-token-v1\x00" + token.encode()).digest()


@dataclass
class Source:
    url: str
    now: int
    tokens: dict = field(default_factory=dict)     # user id -> clear token
    in_flight: dict = field(default_factory=dict)  # job id -> (attempt id, worker id)
    bulk_jobs: int = 0


RECEIPTS = [
    {"id": "r1", "issuer": "warc.example.org", "object_id": "s3://bucket/a.warc.gz",
     "checksum": "sha256:" + "ab" * 32, "size_bytes": 123456, "accepted_at": 1760000100},
    {"id": "r2", "issuer": "warc.example.org", "object_id": "s3://bucket/b.warc.gz",
     "checksum": "sha256:" + "cd" * 32, "size_bytes": 42, "accepted_at": 1760000101},
]
BLOCKED = {"code": "blocked", "message": "robots.txt disallows", "details": {}}
TIMEOUT = {"code": "timeout", "message": "read timed out", "details": {"after_s": 30}}


def _job(job_id, project, value, status, *, ext=None, digest=False, spec=None, reset=0,
         attempt=None, worker=None, lease=None, outcome=None, receipts=None, error=None,
         created=0, updated=0, completed=None, key=None):
    return (job_id, project, ext, value,
            hashlib.sha256(value.encode()).digest() if digest else None,
            key if key is not None else (job_id * 7919) % 2**31 - 2**30,
            json.dumps(spec or {}), status, attempt, worker, lease, reset,
            None if outcome is None else json.dumps(outcome),
            None if receipts is None else json.dumps(receipts),
            None if error is None else json.dumps(error), created, updated, completed)


def fill(url: str, *, bulk_jobs: int = 300) -> Source:
    now = int(time.time())
    t0 = now - 86400
    src = Source(url=url, now=now, bulk_jobs=bulk_jobs)
    src.tokens = {"gh_42": "hq_" + "A1b2C3d4E5f6G7h8I9j0K1l2", "crawler-1": "hq_crawlerOneSecretToken42x",
                  "crawler-2": "hq_onlyTheDigestSurvives000", "old-bot": "hq_revokedLongAgo0000000000"}
    src.in_flight = {3: ("at_Zm9vYmFyYmF6cXV4cXV1eA", "abc1234"),
                     12: ("at_c2Vjb25kLWF0dGVtcHQtMTI", "abc1234"),
                     4: ("at_ZXhwaXJlZC1sZWFzZS0wMDQ", "def5678"),
                     22: ("at_bm8tbWFwLWZvci13b3JrZXI", "zzz0000")}
    users = [("gh_42", "active", ["admin"], 42, "alice"), ("crawler-1", "active", ["worker"], None, None),
             ("crawler-2", "active", ["worker", "admin"], None, None),
             ("old-bot", "suspended", ["worker"], None, None), ("gh_43", "pending", ["worker"], 43, "bob")]
    # (user, clear text kept?, revoked?)
    tokens = [("gh_42", True, False), ("crawler-1", True, False), ("crawler-2", False, False),
              ("old-bot", True, True)]
    projects = [
        ("archive-web", "active", "external_id", "fifo", 50.0, 0.5, 64, 5, 600,
         ["saveweb-1.2.0", VERSION], 4),
        ("uniq", "draining", "unique_value", "random", None, None, 256, 3, 300, [], 1),
        ("plain", "active", "none", "fifo", 1500.0, None, 128, 0, 120, [VERSION], 2),
    ]
    a, w = src.in_flight, "archive-web"
    jobs = [
        _job(1, w, "https://example.org/", "todo", ext="home", created=t0, updated=t0),
        _job(2, w, "https://example.org/a.css", "todo", ext="j1_asset",
             spec={"type": "asset", "via": "https://example.org/", "hops": 2,
                   "attr": {"depth": 1, "tags": ["css"]}}, created=t0 + 1, updated=t0 + 1),
        _job(3, w, "https://example.org/live", "wip", ext="live", attempt=a[3][0], worker=a[3][1],
             lease=now + 900, created=t0 + 2, updated=now - 30),
        _job(4, w, "https://example.org/stale", "wip", ext="stale", attempt=a[4][0], worker=a[4][1],
             lease=now - 100, reset=2, created=t0 + 3, updated=now - 700),
        _job(5, w, "https://example.org/done", "done", ext="done",
             outcome={"kind": "success", "code": 200, "uri": "https://example.org/done",
                      "meta": {"bytes": 5120}}, receipts=RECEIPTS,
             created=t0 + 4, updated=t0 + 500, completed=t0 + 500),
        _job(6, w, "https://example.org/gone", "done", ext="gone",
             outcome={"kind": "http_error", "code": 404, "uri": None, "meta": None}, receipts=None,
             created=t0 + 5, updated=t0 + 600, completed=t0 + 600),
        _job(7, w, "https://example.org/blocked", "failed", ext="blocked", error=BLOCKED,
             created=t0 + 6, updated=t0 + 700, completed=t0 + 700),
        _job(8, w, "https://example.org/flaky", "reset_exhausted", ext="flaky", reset=6, error=TIMEOUT,
             created=t0 + 7, updated=t0 + 800, completed=t0 + 800),
        _job(9, w, "https://example.org/slow", "reset_exhausted", ext="slow", reset=6,
             created=t0 + 8, updated=t0 + 900),
        _job(10, w, "https://example.org/retry", "todo", ext="retry", reset=1, error=TIMEOUT,
             created=t0 + 9, updated=t0 + 1000),
        _job(12, w, "https://example.org/again", "wip", ext="again", reset=1, error=TIMEOUT,
             attempt=a[12][0], worker=a[12][1], lease=now + 300, created=t0 + 10, updated=now - 60),
        _job(20, "uniq", "https://u.example.org/1", "todo", digest=True, created=t0, updated=t0),
        _job(21, "uniq", "https://u.example.org/2", "done", digest=True,
             outcome={"kind": "skipped", "code": None, "uri": None, "meta": {}}, receipts=[],
             created=t0, updated=t0 + 50, completed=t0 + 50),
        _job(22, "uniq", "https://u.example.org/3", "wip", digest=True, attempt=a[22][0],
             worker=a[22][1], lease=now + 120, created=t0, updated=now - 5),
        _job(30, "plain", "plain value one", "todo", created=t0, updated=t0, key=-2**31),
        _job(31, "plain", "plain value one", "done", outcome={"kind": "success", "code": None,
                                                               "uri": None, "meta": {}},
             receipts=[RECEIPTS[0]], created=t0, updated=t0 + 5, completed=t0 + 5, key=2**31 - 1),
        _job(32, "plain", "plain value two", "failed", error=BLOCKED, created=t0, updated=t0 + 9,
             completed=t0 + 9),
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(open(SCHEMA).read())
        with conn.transaction():
            for uid, status, roles, gh_id, login in users:
                conn.execute("INSERT INTO tracker_users (id, status, roles, github_user_id, github_login, "
                             "created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                             (uid, status, roles, gh_id, login, t0 - 1000, t0 - 10))
            for uid, clear, revoked in tokens:
                token = src.tokens[uid]
                conn.execute("INSERT INTO tracker_machine_tokens (user_id, token_hash, token, created_at, "
                             "revoked_at) VALUES (%s, %s, %s, %s, %s)",
                             (uid, saveweb_digest(token), token if clear else None, t0 - 900,
                              t0 - 5 if revoked else None))
            for p in projects:
                conn.execute("INSERT INTO tracker_projects (id, status, identity_mode, claim_order, "
                             "dispatch_qps, worker_claim_qps, max_jobs_per_claim, max_resets, "
                             "recommended_lease_seconds, client_versions, policy_version, "
                             "dispatch_tokens, created_at, updated_at) "
                             "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s, 3.5, %s, %s)",
                             (*p, t0 - 500, t0 - 400))
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO tracker_jobs (job_id, project_id, external_id, value, unique_value_digest, "
                    "random_key, spec, status, attempt_id, worker_id, lease_expires_at, reset_count, "
                    "outcome, artifact_receipts, execution_error, created_at, updated_at, completed_at) "
                    "OVERRIDING SYSTEM VALUE VALUES "
                    "(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", jobs)
            # The bulk: none-mode jobs 1000.., a mix of todo / done / failed.
            conn.execute(
                "INSERT INTO tracker_jobs (job_id, project_id, value, random_key, spec, status, "
                "outcome, artifact_receipts, execution_error, created_at, updated_at, completed_at) "
                "OVERRIDING SYSTEM VALUE SELECT 999 + i, 'plain', 'bulk ' || i, i, '{}', "
                "CASE i %% 3 WHEN 0 THEN 'todo' WHEN 1 THEN 'done' ELSE 'failed' END, "
                "CASE WHEN i %% 3 = 1 THEN '{\"kind\":\"success\",\"code\":200,\"uri\":null,\"meta\":{}}'::jsonb END, "
                "CASE WHEN i %% 3 = 1 THEN '[]'::jsonb END, "
                "CASE WHEN i %% 3 = 2 THEN '{\"code\":\"gone\",\"message\":\"\",\"details\":{}}'::jsonb END, "
                "%s + i, %s + i, CASE WHEN i %% 3 <> 0 THEN %s + i END "
                "FROM generate_series(1, %s) AS i", (t0, t0 + 60, t0 + 60, bulk_jobs))
            conn.execute("INSERT INTO tracker_workers (worker_id, user_id) VALUES "
                         "('abc1234', 'crawler-1'), ('def5678', 'crawler-2'), ('old0001', 'old-bot')")
            conn.execute("INSERT INTO tracker_worker_claim_buckets (project_id, worker_id, "
                         "bucket_started_at_ms, claim_requests, jobs_dispatched, policy_version) VALUES "
                         "('archive-web', 'abc1234', 1760000000000, 3, 12, 4), "
                         "('archive-web', 'def5678', 1760000060000, 1, 1, 4)")
            conn.execute("INSERT INTO tracker_web_sessions (token_hash, user_id, created_at, expires_at) "
                         "VALUES ('\\x00', 'gh_42', %s, %s)", (now - 60, now + 3600))
    return src


def count_by_state(url: str, project_id: str) -> dict:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM tracker_jobs WHERE project_id = %s "
                                 "GROUP BY status", (project_id,)).fetchall())
