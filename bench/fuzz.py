"""Schemathesis against a gunicorn master on a scratch database, with many
more examples per operation than the bounded run in ``make test``
(tests/test_api_fuzz.py): the same checks (no 5xx, documented status codes,
response schemas, content types) and the same hooks.

Failures are printed with schemathesis' reproductions (curl lines).
Last line: ``fuzz operations=N examples=M failures=F seconds=S``; exits 1
when anything failed.
"""
from __future__ import annotations

import argparse
import sys

from _common import ROOT, admin_token, fresh_database, gunicorn

sys.path.insert(0, ROOT)
from tests import api_fuzz  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=400, help="per operation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1,
                        help="schemathesis workers (threads: Python 3.11's ast is not thread-safe)")
    args = parser.parse_args()

    url = fresh_database("fleethq_bench_fuzz")
    token = admin_token(url)
    with gunicorn(url, workers=2, threads=4) as (base, _):
        api_fuzz.seed_master(base, token)
        result = api_fuzz.run(base, token, admin_id="bench", max_examples=args.examples,
                              seed=args.seed, workers=args.workers, timeout_s=3600)
    if result.failures or result.errors:
        print(result.failure_text())
    print(result.summary())
    return 1 if result.failures or result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
