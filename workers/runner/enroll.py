"""Identity, registration and approval (DESIGN §7 steps 1–4).

The identity is written to the volume (0600) *before* ``POST /register``: if
the answer is lost, the retry sends the same id and secret, which the master
accepts again; a fresh identity would be refused by the consumed credential.
"""
from __future__ import annotations

import logging
import threading

from workers.runner.master import RETRY, Master, MasterError, Refused, Unreachable
from workers.runner.volume import Identity, Volume

log = logging.getLogger("fleethq.worker")


class EnrollError(Exception):
    """Registration refused for good; the message says what to do."""


def ensure_registered(volume: Volume, master: Master, *, name: str, credential: str | None,
                      stop: threading.Event) -> Identity:
    identity = volume.load_identity()
    if identity is not None and identity.registered:
        if credential:
            log.info("volume already enrolled as %s; the enrollment credential is not needed "
                     "(and stays unused)", identity.worker_id)
        return identity
    if not credential:
        if identity is None:
            raise EnrollError(f"volume {volume.root} has no identity: pass --enroll with an "
                              "enrollment credential (flask fleet enroll, or the workers page)")
        raise EnrollError(f"identity {identity.worker_id} was never confirmed registered: pass "
                          "--enroll with the same enrollment credential to finish registering")
    if identity is None:
        identity = Identity.generate(name, master.base)
        volume.save_identity(identity)
        log.info("new worker identity %s written to %s", identity.worker_id, volume.identity_path)
    tries = 0
    while not stop.is_set():
        try:
            master.call("POST", "/api/v1/fleet/register", auth=False, body={
                "id": identity.worker_id, "name": identity.name,
                "enrollment_token": credential, "secret": identity.secret})
            break
        except MasterError as exc:
            if isinstance(exc, Unreachable) or exc.retryable:
                delay = RETRY.pause(tries, exc.retry_after_s) or RETRY.max_retry_after_s
                tries += 1
                log.warning("register: %s; retrying with the same identity in %.1f s", exc, delay)
                stop.wait(delay)
                continue
            if exc.status == 409 and exc.code == "invalid_transition":
                break  # this id is already registered (an earlier run got through)
            raise EnrollError(f"the master refused the registration: {exc.message}. "
                              "Ask an admin for a fresh enrollment credential") from None
    else:
        raise InterruptedError("stopped while registering")
    identity.registered = True
    volume.save_identity(identity)
    log.info("registered as %s (%r); waiting for an admin to approve it", identity.worker_id,
             identity.name)
    return identity


def wait_until_approved(master: Master, *, poll_s: float, stop: threading.Event) -> str:
    """Poll ``GET /fleet/status`` until the node is active or draining.

    Raises:
        Refused: the secret is not accepted (revoked, rejected).
        InterruptedError: ``stop`` was set.
    """
    said_pending = False
    tries = 0
    while not stop.is_set():
        try:
            _, node = master.call("GET", "/api/v1/fleet/status")
            tries = 0
        except Refused:
            raise
        except MasterError as exc:
            delay = RETRY.pause(tries, exc.retry_after_s) or RETRY.max_retry_after_s
            tries += 1
            log.warning("status: %s; retrying in %.1f s", exc, delay)
            stop.wait(delay)
            continue
        status = node.get("status")
        if status in ("active", "draining"):
            return status
        if not said_pending:
            log.info("node %s is %s: waiting for an admin to approve it "
                     "(flask fleet worker approve %s, or the workers page)",
                     node.get("worker_id"), status, node.get("worker_id"))
            said_pending = True
        stop.wait(poll_s)
    raise InterruptedError("stopped while waiting for approval")
