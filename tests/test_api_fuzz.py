"""Schemathesis against a live master (real PostgreSQL, real HTTP): every
operation of the served OpenAPI document, bounded examples, zero failures —
no 5xx, no undocumented status, no response off its schema or content type.
The longer run is bench/fuzz.py."""
from __future__ import annotations

import logging

from tests import api_fuzz

MAX_EXAMPLES = 50  # with the coverage phase, about a minute on two cores


def test_schemathesis_finds_no_failure(live_server, admin_token, caplog):
    caplog.set_level(logging.ERROR)
    api_fuzz.seed_master(live_server.url, admin_token)
    result = api_fuzz.run(live_server.url, admin_token, admin_id="admin",
                          max_examples=MAX_EXAMPLES, seed=20261201)
    print(result.summary())
    assert result.operations >= 40, result.output[-3000:]  # the whole document was loaded
    assert result.examples > 20 * result.operations
    assert (result.failures, result.errors) == (0, 0), result.failure_text()
    assert result.exit_code == 0, result.output[-3000:]
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == [], "the master logged tracebacks while fuzzed"
