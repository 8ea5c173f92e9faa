"""Failure codes that master and worker read the same way.

A site that pushes back — it rate-limits us (HTTP 429, or 503), shows a bot
check or a block page — is the fleet's problem, not the job's: the worker
reports it with one of :data:`SITE_PUSHBACK`, and the master pauses the job's
site for every worker (growing on repeats, capped) and puts the job back in
the queue without charging a reset (docs/politeness.md). A SavewebHQ SDK
worker that sends these codes gets the same treatment.

A worker that finds it is itself the problem reports ``worker_unfit``: the
job goes back the same way, and no site is paused.

The error's ``details`` may say what the site said: ``http_status``, and
``retry_after_s`` when it sent a ``Retry-After``.
This module must not import ``app``: both sides use it.
"""
from __future__ import annotations

THROTTLED = "throttled"     # the site rate-limits us: 429, or 503
CHALLENGE = "challenge"     # a bot check (captcha) or a block page
SITE_PUSHBACK = frozenset({THROTTLED, CHALLENGE})

# The worker is the problem (its network, its disk: workers/runner/fitness.py):
# it stops claiming for a while, and the job goes back at once, no reset
# charged. ``details.observed`` keeps the code the fetch itself gave.
WORKER_UNFIT = "worker_unfit"
# Failures that cost the job no reset.
NOT_THE_JOBS_FAULT = SITE_PUSHBACK | {WORKER_UNFIT}
