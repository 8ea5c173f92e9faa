"""Dramatiq: the broker (configured here, before any actor is declared) and actors.

Run with ``dramatiq tasks``. Messages are hints: every actor reloads what it
needs from PostgreSQL, and the clock re-sends periodic work, so losing Redis
delays work but loses none.
"""
from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from tasks.middleware import AppContext


def make_broker():
    if os.environ.get("FLEETHQ_STUB_BROKER"):
        broker = StubBroker()
    else:
        from app import config
        # The configured Redis, which may be a running `make dev` stack's.
        broker = RedisBroker(url=config.load()["REDIS_URL"])
    broker.add_middleware(AppContext())
    return broker


broker = make_broker()
dramatiq.set_broker(broker)

from tasks import actors  # noqa: E402,F401  (declares the actors on the broker)
