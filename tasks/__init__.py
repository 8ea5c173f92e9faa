"""Dramatiq: the broker, configured explicitly from the app's settings, and the actors.

Run with ``dramatiq tasks:setup_broker``: dramatiq's CLI calls that function in
each worker process and then works on the global broker it set. Messages are
hints: every actor reloads what it needs from PostgreSQL, and the clock
re-sends periodic work, so losing Redis delays work but loses none.

Importing this package reads no environment and connects nowhere. Dramatiq
binds an actor to a broker when it is declared, so the actors are declared
on ``declarations``, a broker that only holds their names, queues and
options; ``setup_broker`` builds the configured broker and binds every actor
to it. Sending before that (or running plain ``dramatiq tasks``, whose worker
would find only these declarations) fails loudly instead of talking to a
default Redis.
"""
from __future__ import annotations

from collections.abc import Mapping

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from tasks.middleware import AppContext


class BrokerNotConfigured(RuntimeError):
    pass


class PromptRedisBroker(RedisBroker):
    """Dramatiq's Redis broker, waking an idle consumer at most ``IDLE_POLL_MS`` after a message arrives.

    Its consumers cannot block on Redis: an idle one sleeps with growing
    backoff up to the worker timeout (1 s by default), so a staged upload
    waited up to a second for its archive commit and each hook hop added as
    much again. Capping the sleep keeps that wait under a tenth of a second
    for ~10 cheap fetches a second per idle queue; the cap lives here, not in
    every place that starts ``dramatiq``.
    """

    IDLE_POLL_MS = 100

    def consume(self, queue_name, prefetch=1, timeout=5000):
        return super().consume(queue_name, prefetch=prefetch, timeout=min(timeout, self.IDLE_POLL_MS))


class Declarations(StubBroker):
    """Holds the actors' declarations until ``setup_broker`` binds them."""

    def _refuse(self, *_args, **_kwargs):
        raise BrokerNotConfigured(
            "no broker is configured in this process: call tasks.setup_broker(config) first "
            "(run the tasks process as `dramatiq tasks:setup_broker`)")

    enqueue = consume = _refuse


declarations = Declarations()
dramatiq.set_broker(declarations)

from tasks import actors  # noqa: E402,F401  (declares the actors on ``declarations``)


def make_broker(config: Mapping):
    """The broker of a tasks process for these settings: the configured
    Redis (which may be a running ``make dev`` stack's), or an in-memory one
    (``STUB_BROKER``), with the app-context middleware."""
    broker = StubBroker() if config.get("STUB_BROKER") else PromptRedisBroker(url=config["REDIS_URL"])
    broker.add_middleware(AppContext())
    return broker


def setup_broker(config: Mapping | None = None):
    """Build the broker for ``config`` (default: the app's settings,
    ``app.config.load()``), make it dramatiq's global broker and bind every
    actor to it. Called once per process by its entry point (the tasks
    worker processes, the clock); returns the broker."""
    if config is None:
        from app import config as app_config
        with app_config.reported():
            config = app_config.load()
    broker = make_broker(config)
    if config.get("TASKS_CLOCK"):
        from tasks.clock import InWorker
        broker.add_middleware(InWorker(config))
    for actor in declarations.actors.values():
        actor.broker = broker
        broker.declare_actor(actor)
    dramatiq.set_broker(broker)
    return broker
