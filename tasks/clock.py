"""The scheduler process (``python -m tasks.clock``; run exactly one).

Sends the periodic messages. Sub-minute periods are needed (leases are
reaped every few seconds), so this is a small loop rather than cron syntax.
"""
from __future__ import annotations

import logging
import os
import signal
import time

from tasks import actors

log = logging.getLogger("fleethq.clock")

SCHEDULE = (
    # (actor, period in seconds)
    (actors.reap_leases, float(os.environ.get("FLEETHQ_REAP_EVERY_S", "5"))),
    (actors.fold_counters, float(os.environ.get("FLEETHQ_FOLD_EVERY_S", "30"))),
    (actors.reconcile, float(os.environ.get("FLEETHQ_RECONCILE_EVERY_S", "15"))),
    (actors.sweep_spool, float(os.environ.get("FLEETHQ_SWEEP_SPOOL_EVERY_S", "300"))),
    (actors.prune_claim_buckets, float(os.environ.get("FLEETHQ_PRUNE_CLAIM_BUCKETS_EVERY_S", "3600"))),
    (actors.prune_retention, float(os.environ.get("FLEETHQ_PRUNE_EVERY_S", "60"))),
)


def run(schedule=SCHEDULE, stop=lambda: False) -> None:
    due = {actor.actor_name: 0.0 for actor, _ in schedule}
    while not stop():
        now = time.monotonic()
        for actor, period in schedule:
            if now >= due[actor.actor_name]:
                try:
                    actor.send()
                except Exception as exc:  # Redis down: try again next period
                    log.warning("could not send %s: %s", actor.actor_name, exc)
                due[actor.actor_name] = now + period
        time.sleep(max(0.05, min(due.values()) - time.monotonic()))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s clock %(message)s")
    import tasks
    tasks.setup_broker()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    log.info("clock started")
    try:
        run(stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
