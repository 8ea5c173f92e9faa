"""Where a 1,000-job enqueue's time goes: the web's Python and PostgreSQL's
work, and what each of FleetHQ's features on the ``jobs`` table adds to the
latter.

``bench/vs_savewebhq.py`` finds FleetHQ slower than SavewebHQ's tracker at
``hqctl enqueue`` (1,000 plain jobs per request, one request after another,
so throughput is one request's latency: web CPU plus PostgreSQL CPU). This
splits that latency. One migrated database holds a project without
identities (hqctl's); each variant is a copy of it (``CREATE DATABASE …
TEMPLATE``) with one feature taken off:

- ``value_prefix``: the index behind search by value prefix (``ix_jobs_value_prefix``);
- ``site``: the index behind the site filter (``ix_jobs_site``);
- ``state_id``: the index behind listings, retention and search by state
  (``ix_jobs_project_state_id``);
- ``counts``: the trigger that keeps a project's counts without counting rows
  (``jobs_count_insert``), with the project check it carries;
- ``all``: the four together (SavewebHQ has none of them).

Into each, the app's own code enqueues ``--batches`` batches of 1,000 plain
URL jobs, as the admin route does after parsing (``normalize_jobspec`` then
``enqueue.enqueue``: the rows, the ``COPY``, the counts, the wake-up, the
commit). Measured per batch, after ``--warm`` batches: this process's CPU
(the web's part, JSON parsing timed apart on the request body) and the
PostgreSQL backend's CPU (from /proc). The variants take turns batch by
batch; each figure is the mean over its batches.

Last line: ``enqueue_costs web_ms=… json_ms=… pg_ms=… value_prefix_ms=…
site_ms=… state_id_ms=… counts_ms=… features_ms=…`` — per 1,000 jobs (the
web's figures the median over the variants, which all run the same Python);
``<feature>_ms`` is what PostgreSQL saves without it, ``features_ms`` without
all four.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import psycopg

from _common import BENCH_PG, cpu_seconds, fresh_database

BASE = "bench_enqueue_costs"
VARIANTS = {
    "as_migrated": "",
    "value_prefix": "DROP INDEX ix_jobs_value_prefix",
    "site": "DROP INDEX ix_jobs_site",
    "state_id": "DROP INDEX ix_jobs_project_state_id",
    "counts": "ALTER TABLE jobs DISABLE TRIGGER jobs_count_insert",
}
VARIANTS["all"] = "; ".join(ddl for ddl in VARIANTS.values() if ddl)
def app_for(url: str):
    os.environ["DATABASE_URL"] = url
    from app import create_app
    return create_app()


def make_base() -> None:
    url = fresh_database(BASE)
    app = app_for(url)
    from app.extensions import db
    from app.projects import service
    with app.app_context():
        service.put_contract("bench", {"status": "active", "identity_mode": "none", "dispatch_qps": None,
                                       "worker_claim_qps": None, "max_jobs_per_claim": 256,
                                       "client_versions": ["bench-1"]})
        db.engine.dispose()


def copy_of_base(name: str, ddl: str) -> str:
    database = f"{BASE}_{name}"
    with psycopg.connect(f"{BENCH_PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}" TEMPLATE "{BASE}"')
    url = f"{BENCH_PG}/{database}"
    if ddl:
        with psycopg.connect(url) as conn:
            conn.execute(ddl)
    return url


def body(tag: str, batch: int) -> bytes:
    return json.dumps({"jobs": [{"value": f"https://example.test/{tag}/{batch}/{i}", "type": "seed"}
                                for i in range(1000)]}).encode()


class Variant:
    """One copy of the base database and an app on it."""

    def __init__(self, name: str):
        self.name = name
        self.app = app_for(copy_of_base(name, VARIANTS[name]))
        self.web = self.parse = self.pg = 0.0
        self.batches = 0

    def enqueue(self, batch: int, measure: bool) -> None:
        """One request's work after the HTTP layer, on the session's one
        pooled connection (a web thread's), timed."""
        from sqlalchemy import text

        from app.extensions import db
        from app.projects import enqueue, service
        from workers.wire.protocol import normalize_jobspec, strict_json_loads
        data = body(self.name, batch)
        with self.app.app_context():
            backend = db.session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            db.session.commit()
            # Reading the backend's CPU walks /proc: outside this process's window.
            pg0 = cpu_seconds(backend)
            cpu0 = time.process_time()
            jobs = strict_json_loads(data)["jobs"]
            cpu1 = time.process_time()
            project = service.view("bench")
            enqueue.enqueue(project, [normalize_jobspec(job, project.identity_mode) for job in jobs])
            cpu2 = time.process_time()
            pg2 = cpu_seconds(backend)
            same = db.session.execute(text("SELECT pg_backend_pid()")).scalar_one() == backend
            db.session.commit()
        if measure and same:
            self.parse += cpu1 - cpu0
            self.web += cpu2 - cpu0
            self.pg += pg2 - pg0
            self.batches += 1

    def per_1000(self) -> tuple[float, float, float]:
        """(web CPU, JSON parsing CPU, PostgreSQL backend CPU) per 1,000 jobs, in ms."""
        return tuple(1000 * x / self.batches for x in (self.web, self.parse, self.pg))

    def drop(self) -> None:
        from app.extensions import db
        with self.app.app_context():
            db.engine.dispose()
        with psycopg.connect(f"{BENCH_PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{BASE}_{self.name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=150, help="per variant")
    parser.add_argument("--warm", type=int, default=20)
    args = parser.parse_args()
    make_base()
    variants = [Variant(name) for name in VARIANTS]
    try:
        # Batch by batch, each variant in turn (the first one rotating): this
        # machine's speed drifts by a tenth within minutes, which would
        # otherwise land on whichever variant ran then.
        for batch in range(args.batches):
            for k in range(len(variants)):
                variants[(batch + k) % len(variants)].enqueue(batch, batch >= args.warm)
    finally:
        for variant in variants:
            variant.drop()
        with psycopg.connect(f"{BENCH_PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{BASE}" WITH (FORCE)')
    figures = {v.name: v.per_1000() for v in variants}
    for name, (web, parse, pg) in figures.items():
        print(f"{name:12} web {web:6.2f} ms (json {parse:5.2f}) pg {pg:6.2f} ms per 1000", file=sys.stderr)
    # Every variant runs the same Python: the web's figures are their median.
    web = statistics.median(f[0] for f in figures.values())
    parse = statistics.median(f[1] for f in figures.values())
    pg = figures["as_migrated"][2]
    saved = {name: pg - figures[name][2] for name in VARIANTS if name != "as_migrated"}
    print(f"enqueue_costs web_ms={web:.2f} json_ms={parse:.2f} pg_ms={pg:.2f} "
          + " ".join(f"{name}_ms={saved[name]:.2f}" for name in ("value_prefix", "site", "state_id", "counts"))
          + f" features_ms={saved['all']:.2f}")


if __name__ == "__main__":
    main()
