"""Post-archive webhooks (DESIGN §8 Hooks, issue 3): per-project consumers,
one HMAC-signed JSON POST per enabled consumer and archived asset, retries
with backoff up to 20 tries keeping the last error, 202 + completion
callback, at-least-once delivery from the durable outbox (duplicates after a
restart carry the same delivery id), signed download links, and the admin
API that lists and retries deliveries.

The consumers are real HTTP servers on 127.0.0.1; PostgreSQL is real, and
the end-to-end tests run a real Dramatiq worker on real Redis.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
import requests

from app.storage import content_key, from_config
from tasks import actors
from tests.conftest import free_port
from tests.fleet_helpers import Node
from tests.helpers import body, sql
from tests.support.archive import (Pipeline, Staged, commit_directly,  # noqa: F401 (fixtures)
                                idle_in_transaction, local_store, make_broker, moto, one, rows,
                                pipeline, run_worker, s3_store)
from tests.support.hooks import add_consumer, delivery_ids

SIGNATURE = "X-FleetHQ-Signature"
TIMESTAMP = "X-FleetHQ-Timestamp"


# ------------------------------------------------------------------ consumer


class Consumer:
    """A webhook consumer: records every request, answers ``status``.

    ``during`` (if set) runs inside the request, before the answer is sent.
    """

    def __init__(self, status: int = 200):
        self.status = status
        self.during = None
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        consumer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                record = {"path": self.path, "headers": dict(self.headers.items()), "raw": raw}
                try:
                    record["json"] = json.loads(raw)
                except ValueError:
                    record["json"] = None
                with consumer._lock:
                    consumer.requests.append(record)
                status = consumer.status
                if consumer.during is not None:
                    status = consumer.during(record) or status
                payload = b"{}" if status < 300 else b"consumer is broken today"
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/hooks/fleethq?src=test"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()

    def delivery_ids(self) -> list[str]:
        return [r["json"]["delivery_id"] for r in self.requests]


@pytest.fixture
def consumers():
    made = []

    def make(status: int = 200) -> Consumer:
        made.append(Consumer(status))
        return made[-1]

    yield make
    for consumer in made:
        consumer.close()


# ------------------------------------------------------------------ helpers


def archive(app, pipeline: Pipeline, value: str, seed: int) -> Staged:
    staged = pipeline.stage(value, seed=seed)
    assert commit_directly(app, staged.attempt_id) == "done"
    return staged


def one_delivery(app, pipeline: Pipeline, consumer: Consumer, value: str, seed: int) -> int:
    """Add ``consumer`` to the project, archive one asset: its one delivery."""
    add_consumer(pipeline, consumer.url)
    archive(app, pipeline, value, seed=seed)
    [delivery_id] = delivery_ids(app)
    return delivery_id


def deliver(app, delivery_id: int, secret_key: str | None = None):
    """One delivery attempt, as the deliver_hook actor makes it (under
    ``secret_key`` instead of the app's, if given)."""
    from app.config import outbound_networks
    from app.extensions import db
    from app.hooks import deliveries
    from app.uploads import downloads
    with app.app_context():
        store = from_config(app.config)
        try:
            return deliveries.deliver(
                delivery_id, lambda key: downloads.url_for(store, app.config, key),
                secret_key=secret_key or app.config["SECRET_KEY"], public_url=app.config.get("PUBLIC_URL"),
                allow=outbound_networks(app.config))
        finally:
            db.session.remove()


def delivery(app, delivery_id: int) -> dict:
    return one(app, "SELECT state, tries, last_status, last_error, delivered_at, consumer_id "
                    "FROM hook_deliveries WHERE id = :d", d=delivery_id)


def outbox_rows(app, delivery_id: int) -> list[dict]:
    return rows(app, "SELECT tries, last_error, due_at, done_at, due_at > now() AS later, "
                     "extract(epoch FROM due_at - created_at) AS delay_s "
                     "FROM outbox WHERE topic = 'hook_delivery' AND ref = :d ORDER BY id",
                d=delivery_id)


def expected_signature(secret: str, request: dict) -> str:
    timestamp = request["headers"][TIMESTAMP]
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + request["raw"], hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def admin_list(pipeline: Pipeline, query: str = ""):
    return pipeline.api.call("GET", f"/api/v1/admin/hooks/deliveries{query}")


def callback(client, path: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return client.post(path, headers=headers)


# ------------------------------------------------------------- signed POST


def consumer_row(app, consumer_id) -> dict:
    return one(app, "SELECT secret, secret_sealed FROM hook_consumers WHERE id = :c", c=int(consumer_id))


def seal_clear_secrets(app, config=None) -> int:
    from app.extensions import db
    from app.hooks import consumers as hook_consumers
    with app.app_context():
        try:
            return hook_consumers.seal_clear_secrets(config or app.config)
        finally:
            db.session.remove()


def test_signing_secrets_are_sealed_at_rest_and_sign_only_under_their_key(app, pipeline, consumers):
    consumer = consumers()
    secret = "a-chosen-secret-of-enough-length"
    created = add_consumer(pipeline, consumer.url, secret=secret)
    row = consumer_row(app, created["consumer_id"])
    # A database dump shows no secret: none in clear, none inside the sealed bytes.
    assert row["secret"] is None and secret.encode() not in bytes(row["secret_sealed"])
    archive(app, pipeline, "10.1234/sealed", seed=31)
    [delivery_id] = delivery_ids(app)

    # Under another SECRET_KEY the secret does not open: the try fails with
    # a reason and stays due again, nothing unsigned is sent.
    assert deliver(app, delivery_id, secret_key="a-different-secret-key") == "pending"
    assert consumer.requests == []
    failed = delivery(app, delivery_id)
    assert failed["tries"] == 1 and "does not open under this SECRET_KEY" in failed["last_error"]
    assert not outbox_rows(app, delivery_id)[0]["done_at"]

    # Back under the key it was sealed with, it signs.
    sql(app, "UPDATE outbox SET due_at = now() WHERE topic = 'hook_delivery'")
    assert deliver(app, delivery_id) == "delivered"
    [request] = consumer.requests
    assert request["headers"][SIGNATURE] == expected_signature(secret, request)

    # A sealed secret copied onto another consumer's row does not open there.
    other = consumers()
    other_id = add_consumer(pipeline, other.url, name="other")["consumer_id"]
    sql(app, "UPDATE hook_consumers SET secret_sealed = (SELECT secret_sealed FROM hook_consumers "
             "WHERE id = :a) WHERE id = :b", a=int(created["consumer_id"]), b=int(other_id))
    archive(app, pipeline, "10.1234/copied", seed=32)
    copied = [d for d in delivery_ids(app) if delivery(app, d)["consumer_id"] == int(other_id)]
    assert deliver(app, copied[0]) == "pending" and other.requests == []


def test_secrets_kept_in_clear_are_sealed_by_the_reconcile_tick_and_still_sign(app, pipeline, consumers):
    consumer = consumers()
    created = add_consumer(pipeline, consumer.url)
    # As a row from before revision 0025 (or made without a configured SECRET_KEY) is.
    sql(app, "UPDATE hook_consumers SET secret = 'an-old-clear-secret-0123', secret_sealed = NULL "
             "WHERE id = :c", c=int(created["consumer_id"]))
    # A process that made its own key seals nothing: no other process could open it.
    assert seal_clear_secrets(app, {**app.config, "SECRET_KEY_GENERATED": True}) == 0
    assert consumer_row(app, created["consumer_id"])["secret"] == "an-old-clear-secret-0123"

    assert seal_clear_secrets(app) == 1
    row = consumer_row(app, created["consumer_id"])
    assert row["secret"] is None and b"an-old-clear-secret-0123" not in bytes(row["secret_sealed"])
    assert seal_clear_secrets(app) == 0
    archive(app, pipeline, "10.1234/resealed", seed=33)
    [delivery_id] = delivery_ids(app)
    assert deliver(app, delivery_id) == "delivered"
    [request] = consumer.requests
    assert request["headers"][SIGNATURE] == expected_signature("an-old-clear-secret-0123", request)


def test_signed_delivery_carries_the_asset_and_a_working_download_link(
        app, client, pipeline, consumers, hints, database_url):
    consumer = consumers()
    created = add_consumer(pipeline, consumer.url)
    secret = created["secret"]
    assert created["enabled"] is True and len(secret) >= 32
    listed = body(pipeline.api.call("GET", f"/api/v1/admin/projects/{pipeline.project}/hooks"))
    assert [c["consumer_id"] for c in listed["consumers"]] == [created["consumer_id"]]
    assert "secret" not in listed["consumers"][0]  # shown once

    staged = archive(app, pipeline, "10.1234/hooked", seed=1)
    [delivery_id] = delivery_ids(app)
    assert delivery(app, delivery_id)["state"] == "pending"
    [outbox] = outbox_rows(app, delivery_id)
    assert outbox["done_at"] is None and not outbox["later"]
    assert ("hook_delivery", delivery_id) in hints  # hint after commit

    open_during_post = []
    consumer.during = lambda _: open_during_post.extend(idle_in_transaction(database_url))
    assert deliver(app, delivery_id) == "delivered"
    assert open_during_post == []  # no transaction held across the webhook call

    [request] = consumer.requests
    assert request["path"] == "/hooks/fleethq?src=test"
    assert request["headers"]["Content-Type"] == "application/json"
    payload = request["json"]
    key = content_key(staged.sha256)
    assert {k: payload[k] for k in ("delivery_id", "asset_key", "sha256", "size", "canonical_key")} \
        == {"delivery_id": str(delivery_id), "asset_key": key, "sha256": staged.sha256,
            "size": staged.size, "canonical_key": "doi:10.1234/hooked"}
    assert payload["callback_url"] == f"/api/v1/hooks/deliveries/{delivery_id}/complete"
    assert payload["callback_token"].startswith("fhqc_")
    assert request["headers"]["X-FleetHQ-Delivery"] == str(delivery_id)

    # The signature covers the timestamp and the exact body.
    assert request["headers"][SIGNATURE] == expected_signature(secret, request)
    assert abs(int(request["headers"][TIMESTAMP]) - time.time()) < 600
    assert request["headers"][SIGNATURE] != expected_signature("another-secret-entirely", request)

    # The download link serves the archived bytes without a token.
    link = urlsplit(payload["download_url"])
    assert link.path == f"/api/v1/assets/{key}"
    path = f"{link.path}?{link.query}"
    response = client.get(path)
    assert response.status_code == 200
    assert response.data == staged.data and response.mimetype == "application/pdf"
    assert payload["download_expires_at"] > time.time()
    # A worker's file from the master's origin: a download, sandboxed if rendered.
    assert response.headers["Content-Disposition"].startswith('attachment; filename="')
    assert response.headers["Content-Security-Policy"] == "sandbox"
    assert response.headers["X-Content-Type-Options"] == "nosniff"

    # A tampered signature, another object, or an expired link: 403.
    from app.uploads import downloads
    params = dict(p.split("=", 1) for p in link.query.split("&"))
    tampered = params["sig"][:-1] + ("0" if params["sig"][-1] != "0" else "1")
    assert client.get(f"{link.path}?expires={params['expires']}&sig={tampered}").status_code == 403
    other = content_key("ab" * 32)
    assert client.get(f"/api/v1/assets/{other}?{link.query}").status_code == 403
    assert client.get(link.path).status_code == 403
    expired = downloads.signed_path(app.config["SECRET_KEY"], key, int(time.time()) - 5)
    assert client.get(expired).status_code == 403
    later = int(params["expires"]) + 3600  # a later expiry under the old signature
    assert client.get(f"{link.path}?expires={later}&sig={params['sig']}").status_code == 403

    row = delivery(app, delivery_id)
    assert (row["state"], row["tries"], row["last_status"], row["last_error"]) == (
        "delivered", 1, 200, None)
    assert row["delivered_at"] is not None
    assert outbox_rows(app, delivery_id)[0]["done_at"] is not None
    # Delivered is final: another hint does nothing.
    assert deliver(app, delivery_id) is None
    assert len(consumer.requests) == 1


# ---------------------------------------------------------------- retries


def test_failing_consumer_retries_with_backoff_then_fails_then_admin_retry(
        app, pipeline, consumers, hints):
    consumer = consumers(status=500)
    add_consumer(pipeline, consumer.url)
    archive(app, pipeline, "10.1234/flaky", seed=2)
    [delivery_id] = delivery_ids(app)

    assert deliver(app, delivery_id) == "pending"
    row = delivery(app, delivery_id)
    assert (row["state"], row["tries"], row["last_status"]) == ("pending", 1, 500)
    # The status, never the consumer's answer body (the master is nobody's reading proxy).
    assert row["last_error"] == "HTTP 500"
    [first] = outbox_rows(app, delivery_id)
    assert first["tries"] == 1 and first["delay_s"] >= 5 and first["done_at"] is None
    assert "500" in first["last_error"]

    assert deliver(app, delivery_id) == "pending"
    [second] = outbox_rows(app, delivery_id)
    assert second["tries"] == 2
    # Exponential: the second wait is longer than the first.
    gap = one(app, "SELECT extract(epoch FROM CAST(:b AS timestamptz) - CAST(:a AS timestamptz)) AS s",
              a=first["due_at"], b=second["due_at"])["s"]
    assert gap > 3

    states = [deliver(app, delivery_id) for _ in range(18)]
    assert states == ["pending"] * 17 + ["failed"]
    row = delivery(app, delivery_id)
    assert (row["state"], row["tries"], row["last_status"]) == ("failed", 20, 500)
    assert "500" in row["last_error"]
    assert [r["done_at"] is not None for r in outbox_rows(app, delivery_id)] == [True]
    assert len(consumer.requests) == 20
    assert set(consumer.delivery_ids()) == {str(delivery_id)}
    assert deliver(app, delivery_id) is None  # failed is final until an admin retries
    assert len(consumer.requests) == 20

    failed = body(admin_list(pipeline, "?state=failed"))["deliveries"]
    assert [(d["delivery_id"], d["state"], d["tries"], d["last_status"]) for d in failed] == [
        (str(delivery_id), "failed", 20, 500)]
    assert "500" in failed[0]["last_error"]
    assert body(admin_list(pipeline, "?state=delivered"))["deliveries"] == []
    assert admin_list(pipeline, "?state=bogus").status_code == 400

    # The admin retries once the consumer is fixed.
    consumer.status = 200
    hints.clear()
    response = pipeline.api.call("POST", f"/api/v1/admin/hooks/deliveries/{delivery_id}/retry")
    assert response.status_code == 200, body(response)
    assert body(response)["state"] == "pending"
    assert hints == [("hook_delivery", delivery_id)]
    fresh = [r for r in outbox_rows(app, delivery_id) if r["done_at"] is None]
    assert len(fresh) == 1 and not fresh[0]["later"]  # due now: the reconciler would send it too
    assert deliver(app, delivery_id) == "delivered"
    assert delivery(app, delivery_id)["state"] == "delivered"
    assert len(consumer.requests) == 21
    assert body(admin_list(pipeline, "?state=failed"))["deliveries"] == []
    # A delivered delivery cannot be retried.
    again = pipeline.api.call("POST", f"/api/v1/admin/hooks/deliveries/{delivery_id}/retry")
    assert again.status_code == 404


def test_admin_list_shows_failures_with_last_error(app, pipeline, consumers):
    broken = consumers(status=503)
    add_consumer(pipeline, broken.url, name="broken")
    gone_url = f"http://127.0.0.1:{free_port()}/nobody-listens"
    add_consumer(pipeline, gone_url, name="gone")
    healthy = consumers()
    add_consumer(pipeline, healthy.url, name="healthy")
    archive(app, pipeline, "10.1234/listed", seed=3)
    ids = delivery_ids(app)
    assert len(ids) == 3
    for delivery_id in ids:
        deliver(app, delivery_id)
    rows(app, "UPDATE hook_deliveries SET tries = 19 WHERE state = 'pending'")
    assert sorted(deliver(app, d) for d in ids[:2]) == ["failed", "failed"]

    listing = body(admin_list(pipeline, "?state=failed"))["deliveries"]
    errors = {d["url"]: (d["last_status"], d["last_error"]) for d in listing}
    assert set(errors) == {broken.url, gone_url}
    assert errors[broken.url][0] == 503 and "503" in errors[broken.url][1]
    assert errors[gone_url][0] is None and "Connection" in errors[gone_url][1]
    assert all(d["tries"] == 20 and d["project_id"] == pipeline.project for d in listing)
    everything = body(admin_list(pipeline, f"?project={pipeline.project}"))["deliveries"]
    assert sorted(d["state"] for d in everything) == ["delivered", "failed", "failed"]
    assert body(admin_list(pipeline, "?project=another-project"))["deliveries"] == []


# ------------------------------------------------------------ 202 + callback


def test_202_waits_for_the_completion_callback(app, client, pipeline, consumers, admin_token):
    consumer = consumers(status=202)
    created = add_consumer(pipeline, consumer.url)
    assert created["completion_timeout_seconds"] == 3600  # the default
    archive(app, pipeline, "10.1234/async", seed=4)
    [delivery_id] = delivery_ids(app)

    assert deliver(app, delivery_id) == "awaiting_callback"
    row = delivery(app, delivery_id)
    assert (row["state"], row["tries"], row["last_status"], row["delivered_at"]) == (
        "awaiting_callback", 1, 202, None)
    # Accepted is not done: the outbox row stays open, due after the completion timeout.
    [waiting_row] = outbox_rows(app, delivery_id)
    assert waiting_row["done_at"] is None and 3600 <= waiting_row["delay_s"] <= 3600 + 60
    waiting = body(admin_list(pipeline, "?state=awaiting_callback"))["deliveries"]
    assert [d["delivery_id"] for d in waiting] == [str(delivery_id)]
    # No re-POST before the completion timeout, however often a hint arrives.
    assert deliver(app, delivery_id) is None
    assert len(consumer.requests) == 1
    assert delivery(app, delivery_id)["state"] == "awaiting_callback"

    payload = consumer.requests[0]["json"]
    path, token = payload["callback_url"], payload["callback_token"]
    # Wrong, missing or foreign credentials are refused and change nothing.
    assert callback(client, path, "fhqc_" + "A" * 43).status_code in (401, 403)
    assert callback(client, path, None).status_code in (401, 403)
    assert callback(client, path, admin_token).status_code in (401, 403)
    assert callback(client, path, consumer.requests[0]["headers"][SIGNATURE]).status_code in (401, 403)
    other = f"/api/v1/hooks/deliveries/{delivery_id + 1}/complete"
    assert callback(client, other, token).status_code in (401, 403, 404)
    assert delivery(app, delivery_id)["state"] == "awaiting_callback"

    # The completion timeout passes without a callback: the delivery is sent
    # again, same delivery id and callback token, and waits again.
    expire_wait(app, delivery_id)
    assert deliver(app, delivery_id) == "awaiting_callback"
    assert len(consumer.requests) == 2
    again = consumer.requests[1]["json"]
    assert (again["delivery_id"], again["callback_token"]) == (str(delivery_id), token)
    row = delivery(app, delivery_id)
    assert (row["state"], row["tries"], row["last_status"]) == ("awaiting_callback", 2, 202)
    [rewaiting] = outbox_rows(app, delivery_id)
    assert rewaiting["done_at"] is None and rewaiting["later"]

    done = callback(client, path, token)
    assert done.status_code == 200, done.json
    assert done.json["state"] == "delivered"
    row = delivery(app, delivery_id)
    assert row["state"] == "delivered" and row["delivered_at"] is not None
    assert outbox_rows(app, delivery_id)[0]["done_at"] is not None  # nothing re-sends it now
    # A replayed callback is idempotent.
    replay = callback(client, path, token)
    assert replay.status_code == 200 and replay.json["state"] == "delivered"
    assert delivery(app, delivery_id)["state"] == "delivered"
    expire_wait(app, delivery_id)
    assert deliver(app, delivery_id) is None
    assert len(consumer.requests) == 2


def expire_wait(app, delivery_id: int) -> None:
    """Move a 202's completion deadline (and its outbox row) into the past."""
    rows(app, "UPDATE hook_deliveries SET awaiting_until = now() - interval '1 second' "
              "WHERE id = :d", d=delivery_id)
    rows(app, "UPDATE outbox SET due_at = now() - interval '1 second' "
              "WHERE topic = 'hook_delivery' AND ref = :d AND done_at IS NULL", d=delivery_id)


def test_202_without_a_callback_fails_after_the_last_try_and_a_late_callback_still_counts(
        app, client, pipeline, consumers):
    consumer = consumers(status=202)
    delivery_id = one_delivery(app, pipeline, consumer, "10.1234/never-calls", 15)
    rows(app, "UPDATE hook_deliveries SET tries = 19 WHERE id = :d", d=delivery_id)
    assert deliver(app, delivery_id) == "awaiting_callback"  # the 20th try, answered 202
    expire_wait(app, delivery_id)
    assert deliver(app, delivery_id) is None
    assert len(consumer.requests) == 1  # no 21st POST
    row = delivery(app, delivery_id)
    assert (row["state"], row["tries"]) == ("failed", 20)
    assert "no completion callback within 3600 s" in row["last_error"]
    assert outbox_rows(app, delivery_id)[0]["done_at"] is not None
    failed = body(admin_list(pipeline, "?state=failed"))["deliveries"]
    assert [d["delivery_id"] for d in failed] == [str(delivery_id)]
    assert hook_metrics(client, pipeline.project)["fleethq_hook_deliveries_failed"] == 1

    # The converter finishes after all: its callback is the truth.
    payload = consumer.requests[0]["json"]
    late = callback(client, payload["callback_url"], payload["callback_token"])
    assert late.status_code == 200 and late.json["state"] == "delivered"
    assert delivery(app, delivery_id)["state"] == "delivered"
    assert body(admin_list(pipeline, "?state=failed"))["deliveries"] == []


def test_a_consumer_down_after_its_202_is_retried_with_backoff(app, pipeline, consumers):
    """The re-send after the completion timeout finds the converter down: the
    usual retry backoff applies, and when it is back the delivery waits again."""
    consumer = consumers(status=202)
    delivery_id = one_delivery(app, pipeline, consumer, "10.1234/down-later", 16)
    assert deliver(app, delivery_id) == "awaiting_callback"
    consumer.status = 503
    expire_wait(app, delivery_id)
    assert deliver(app, delivery_id) == "pending"
    row = delivery(app, delivery_id)
    assert (row["state"], row["tries"], row["last_status"]) == ("pending", 2, 503)
    [retry] = outbox_rows(app, delivery_id)
    assert retry["done_at"] is None and retry["later"]
    consumer.status = 202
    assert deliver(app, delivery_id) == "awaiting_callback"
    assert delivery(app, delivery_id)["tries"] == 3
    assert len({r["json"]["callback_token"] for r in consumer.requests}) == 1


def test_callback_needs_a_callback_token_not_a_node_secret(app, client, pipeline, consumers):
    consumer = consumers(status=202)
    add_consumer(pipeline, consumer.url)
    archive(app, pipeline, "10.1234/node", seed=11)
    [delivery_id] = delivery_ids(app)
    deliver(app, delivery_id)
    node = Node(client, app)
    path = consumer.requests[0]["json"]["callback_url"]
    assert client.post(path, headers=node.headers).status_code in (401, 403)
    assert client.post("/api/v1/hooks/deliveries/x1/complete",
                       headers={"Authorization": "Bearer fhqc_x"}).status_code in (401, 403, 404)
    assert delivery(app, delivery_id)["state"] == "awaiting_callback"


# ---------------------------------------------------- consumers per project


def test_disabled_consumers_are_skipped_and_each_enabled_one_gets_a_delivery(
        app, client, pipeline, consumers):
    first, second, off, later_off = consumers(), consumers(), consumers(), consumers()
    add_consumer(pipeline, first.url, name="first")
    add_consumer(pipeline, second.url, name="second")
    add_consumer(pipeline, off.url, name="off", enabled=False)
    late = add_consumer(pipeline, later_off.url, name="later-off")
    archive(app, pipeline, "10.1234/fanout", seed=6)
    ids = delivery_ids(app)
    assert len(ids) == 3  # one per enabled consumer, none for the disabled one

    # Disabled after the delivery was queued: skipped too.
    response = pipeline.api.call(
        "PATCH", f"/api/v1/admin/projects/{pipeline.project}/hooks/{late['consumer_id']}",
        {"enabled": False})
    assert response.status_code == 200 and body(response)["enabled"] is False
    for delivery_id in ids:
        deliver(app, delivery_id)
    assert (len(first.requests), len(second.requests), len(off.requests), len(later_off.requests)) \
        == (1, 1, 0, 0)
    assert first.requests[0]["json"]["delivery_id"] != second.requests[0]["json"]["delivery_id"]
    assert first.requests[0]["json"]["sha256"] == second.requests[0]["json"]["sha256"]
    states = {row["consumer_id"]: row["state"] for row in
              rows(app, "SELECT consumer_id, state FROM hook_deliveries")}
    assert states[int(late["consumer_id"])] == "skipped"  # on purpose: not a failure
    assert sorted(states.values()).count("delivered") == 2
    assert body(admin_list(pipeline, "?state=failed"))["deliveries"] == []
    skipped = body(admin_list(pipeline, "?state=skipped"))["deliveries"]
    assert [d["consumer_id"] for d in skipped] == [late["consumer_id"]]
    assert rows(app, "SELECT id FROM outbox WHERE done_at IS NULL") == []  # nothing retries forever

    # A second archived asset: again one delivery per enabled consumer.
    archive(app, pipeline, "10.1234/fanout-2", seed=7)
    assert len(delivery_ids(app)) == 5


# ------------------------------------------------ at least once, end to end


def die_after_posting(monkeypatch, deliveries):
    """The delivery's POST reaches the consumer, then the process "dies"
    before the outcome is recorded. Returns the real ``outbound.post``."""
    real_post = deliveries.outbound.post

    def post_then_die(*args, **kwargs):
        real_post(*args, **kwargs)
        raise ProcessDied("killed before the outcome was recorded")
    monkeypatch.setattr(deliveries.outbound, "post", post_then_die)
    return real_post


class ProcessDied(Exception):
    """The tasks process died right after the consumer got the POST."""


def test_worker_delivers_to_two_consumers_end_to_end(app, client, pipeline, consumers,
                                                     make_broker):
    broker = make_broker()
    one_consumer, other = consumers(), consumers()
    secrets = [add_consumer(pipeline, c.url, name=f"c{i}")["secret"]
               for i, c in enumerate((one_consumer, other))]
    staged = pipeline.stage("10.1234/e2e", seed=8)
    run_worker(broker)  # archive_commit, then deliver_hook x2 from its after-commit hints
    assert sorted(broker.recorder.names()) == ["archive_commit", "deliver_hook", "deliver_hook"]
    assert [e for _, _, e in broker.recorder.processed] == [None] * 3
    for consumer, secret in zip((one_consumer, other), secrets):
        [request] = consumer.requests
        assert request["headers"][SIGNATURE] == expected_signature(secret, request)
        assert request["json"]["sha256"] == staged.sha256
        link = urlsplit(request["json"]["download_url"])
        fetched = client.get(f"{link.path}?{link.query}")  # signed by the tasks process
        assert fetched.status_code == 200 and fetched.data == staged.data
    assert sorted(r["state"] for r in rows(app, "SELECT state FROM hook_deliveries")) == [
        "delivered", "delivered"]


def test_duplicate_delivery_after_a_restart_keeps_the_delivery_id(
        app, pipeline, consumers, make_broker, monkeypatch):
    from app.hooks import deliveries
    consumer = consumers()
    secret = add_consumer(pipeline, consumer.url)["secret"]
    archive(app, pipeline, "10.1234/twice", seed=9)
    [delivery_id] = delivery_ids(app)

    broker = make_broker()
    real_post = die_after_posting(monkeypatch, deliveries)
    actors.deliver_hook.send(delivery_id)
    run_worker(broker)
    [(name, _, exc)] = broker.recorder.processed
    assert name == "deliver_hook" and isinstance(exc, ProcessDied)
    assert len(consumer.requests) == 1
    assert delivery(app, delivery_id)["state"] == "pending"  # the outcome was never recorded
    [outbox] = outbox_rows(app, delivery_id)
    assert outbox["done_at"] is None and not outbox["later"]

    # After the restart the reconciler re-sends the outbox row.
    monkeypatch.setattr(deliveries.outbound, "post", real_post)
    restarted = make_broker()
    actors.reconcile.send()
    run_worker(restarted)
    assert sorted(restarted.recorder.names()) == ["deliver_hook", "reconcile"]
    assert delivery(app, delivery_id)["state"] == "delivered"

    # The consumer saw the same delivery twice and can coalesce by its id.
    assert len(consumer.requests) == 2
    first, second = (r["json"] for r in consumer.requests)
    assert first["delivery_id"] == second["delivery_id"] == str(delivery_id)
    assert [r["headers"]["X-FleetHQ-Delivery"] for r in consumer.requests] == [str(delivery_id)] * 2
    for key in ("asset_key", "sha256", "size", "canonical_key", "attempt_id", "job_id"):
        assert first[key] == second[key]
    for request in consumer.requests:
        assert request["headers"][SIGNATURE] == expected_signature(secret, request)
    actors.reconcile.send()
    run_worker(restarted)
    assert len(consumer.requests) == 2  # nothing due any more


# ------------------------------------------------------ consumer admin API


def test_consumer_admin_api_validates_and_is_admin_only(app, client, pipeline, consumers,
                                                        make_user):
    consumer = consumers()
    base = f"/api/v1/admin/projects/{pipeline.project}/hooks"
    for bad in ({"name": "x", "url": "ftp://example.org/hook"},
                {"name": "x", "url": "not a url"},
                {"name": "", "url": consumer.url},
                {"name": "x", "url": consumer.url, "secret": "short"},
                {"name": "x", "url": consumer.url, "surprise": True},
                {"name": "x", "url": "https://[unclosed-ipv6/hook"},  # once a 500
                {"name": "x", "url": "http://[::1/hook"}):
        assert pipeline.api.call("POST", base, bad).status_code == 400, bad
    created = add_consumer(pipeline, consumer.url)
    patched = pipeline.api.call("PATCH", f"{base}/{created['consumer_id']}",
                                {"url": "https://[unclosed-ipv6/hook"})
    assert (patched.status_code, body(patched)["error"]["details"]) == (400, {"field": "url"})
    pipeline.api.call("DELETE", f"{base}/{created['consumer_id']}")
    assert pipeline.api.call("POST", "/api/v1/admin/projects/no-such-project/hooks",
                             {"name": "x", "url": consumer.url}).status_code == 404

    worker_token = make_user("volunteer", ["worker"])
    node = Node(client, app)
    for headers in ({"Authorization": f"Bearer {worker_token}"}, node.headers, {}):
        assert client.post(base, json={"name": "x", "url": consumer.url},
                           headers=headers).status_code in (401, 403)
        assert client.get(base, headers=headers).status_code in (401, 403)
        assert client.get("/api/v1/admin/hooks/deliveries", headers=headers).status_code in (401, 403)
        assert client.post("/api/v1/admin/hooks/deliveries/1/retry",
                           headers=headers).status_code in (401, 403)
    assert body(pipeline.api.call("GET", base))["consumers"] == []

    # A secret chosen by the admin is the one that signs.
    secret = "a-chosen-secret-of-enough-length"
    assert add_consumer(pipeline, consumer.url, secret=secret)["secret"] == secret
    archive(app, pipeline, "10.1234/chosen", seed=12)
    [delivery_id] = delivery_ids(app)
    assert deliver(app, delivery_id) == "delivered"
    [request] = consumer.requests
    assert request["headers"][SIGNATURE] == expected_signature(secret, request)

    # Deleting a consumer removes its deliveries; nothing is retried for it.
    consumer_id = body(pipeline.api.call("GET", base))["consumers"][0]["consumer_id"]
    assert pipeline.api.call("DELETE", f"{base}/{consumer_id}").status_code == 204
    assert pipeline.api.call("DELETE", f"{base}/{consumer_id}").status_code == 404
    assert delivery_ids(app) == []


def test_s3_store_hands_out_a_presigned_download_url(app, pipeline, consumers, moto, s3_store):
    consumer = consumers()
    add_consumer(pipeline, consumer.url)
    staged = archive(app, pipeline, "10.1234/s3-hook", seed=13)
    [delivery_id] = delivery_ids(app)
    assert deliver(app, delivery_id) == "delivered"
    payload = consumer.requests[0]["json"]
    assert payload["download_url"].startswith(moto.url)
    fetched = requests.get(payload["download_url"], timeout=10)
    assert fetched.status_code == 200
    assert hashlib.sha256(fetched.content).hexdigest() == staged.sha256


# ------------------------- callbacks: early, after redelivery, absolute URLs


def test_callback_arriving_before_the_202_is_recorded_still_completes(
        app, client, pipeline, consumers):
    """A fast consumer: its worker finishes and calls back while the 202
    answer is still on its way. The delivery must not hang in
    ``awaiting_callback`` forever."""
    consumer = consumers(status=202)
    add_consumer(pipeline, consumer.url)
    archive(app, pipeline, "10.1234/fast", seed=5)
    [delivery_id] = delivery_ids(app)
    answers = []

    def call_back_first(record):
        payload = record["json"]
        answers.append(callback(client, payload["callback_url"], payload["callback_token"]))
        return 202

    consumer.during = call_back_first
    deliver(app, delivery_id)
    assert len(answers) == 1
    assert answers[0].status_code == 200, answers[0].json
    assert delivery(app, delivery_id)["state"] == "delivered"


def test_coalescing_consumer_confirms_with_the_token_it_kept(app, client, pipeline, consumers,
                                                             monkeypatch):
    """At least once + 202: the consumer accepts the first POST (202), the
    tasks process dies before recording it, the delivery comes again; the
    consumer coalesces the duplicate (it already has the job) and later
    confirms with the callback token it kept."""
    from app.hooks import deliveries
    consumer = consumers(status=202)
    add_consumer(pipeline, consumer.url)
    archive(app, pipeline, "10.1234/coalesce", seed=10)
    [delivery_id] = delivery_ids(app)

    real_post = die_after_posting(monkeypatch, deliveries)
    with pytest.raises(ProcessDied):
        deliver(app, delivery_id)
    monkeypatch.setattr(deliveries.outbound, "post", real_post)
    assert deliver(app, delivery_id) == "awaiting_callback"  # the re-sent duplicate
    first, duplicate = (r["json"] for r in consumer.requests)
    assert first["delivery_id"] == duplicate["delivery_id"]

    kept = first["callback_token"]  # the duplicate was coalesced away
    confirmed = callback(client, first["callback_url"], kept)
    assert confirmed.status_code == 200, confirmed.json
    assert delivery(app, delivery_id)["state"] == "delivered"


def test_public_url_prefixes_the_download_and_callback_urls(app, client, pipeline, consumers,
                                                           monkeypatch):
    """With PUBLIC_URL set, a remote consumer gets absolute URLs it can use:
    the download link and the completion callback alike."""
    monkeypatch.setitem(app.config, "PUBLIC_URL", "https://hq.example.org/")
    consumer = consumers(status=202)
    add_consumer(pipeline, consumer.url)
    archive(app, pipeline, "10.1234/public", seed=14)
    [delivery_id] = delivery_ids(app)
    deliver(app, delivery_id)
    payload = consumer.requests[0]["json"]
    assert payload["download_url"].startswith("https://hq.example.org/api/v1/assets/")
    assert payload["callback_url"] == (
        f"https://hq.example.org/api/v1/hooks/deliveries/{delivery_id}/complete")


# --------------------------------------- completion timeout, settable per consumer


def test_completion_timeout_is_validated_on_create_and_update(app, pipeline, consumers):
    consumer = consumers(status=202)
    base = f"/api/v1/admin/projects/{pipeline.project}/hooks"
    for bad in (9, 604801, 0, -1, "60", True, 60.5, None):
        response = pipeline.api.call("POST", base, {"name": "x", "url": consumer.url,
                                                    "completion_timeout_seconds": bad})
        assert response.status_code == 400, bad
        assert body(response)["error"]["details"] == {"field": "completion_timeout_seconds"}, bad
    assert body(pipeline.api.call("GET", base))["consumers"] == []
    created = add_consumer(pipeline, consumer.url, completion_timeout_seconds=10)
    assert created["completion_timeout_seconds"] == 10
    path = f"{base}/{created['consumer_id']}"
    for bad in (604801, "3600", False):
        response = pipeline.api.call("PATCH", path, {"completion_timeout_seconds": bad})
        assert response.status_code == 400, bad
        assert body(response)["error"]["details"] == {"field": "completion_timeout_seconds"}
    patched = pipeline.api.call("PATCH", path, {"completion_timeout_seconds": 604800})
    assert patched.status_code == 200 and body(patched)["completion_timeout_seconds"] == 604800
    [listed] = body(pipeline.api.call("GET", base))["consumers"]
    assert listed["completion_timeout_seconds"] == 604800

    # The consumer's own timeout decides when a 202 is sent again.
    pipeline.api.call("PATCH", path, {"completion_timeout_seconds": 45})
    archive(app, pipeline, "10.1234/own-timeout", seed=17)
    [delivery_id] = delivery_ids(app)
    assert deliver(app, delivery_id) == "awaiting_callback"
    wait = one(app, "SELECT extract(epoch FROM awaiting_until - updated_at) AS s FROM hook_deliveries "
                    "WHERE id = :d", d=delivery_id)["s"]
    assert 45 + 5 <= wait <= 45 + 5 + 30  # the timeout, plus the first backoff step


# ------------------------------------------- ensure again: backfill and re-enable


def ensure(app, batch: int | None = None) -> dict:
    from app.extensions import db
    from app.hooks import backfill
    with app.app_context():
        try:
            return backfill.ensure(batch) if batch is not None else backfill.ensure()
        finally:
            db.session.remove()


def test_consumer_added_later_gets_every_earlier_asset_in_bounded_batches(
        app, pipeline, consumers, hints):
    staged = [archive(app, pipeline, f"10.1234/before-{i}", seed=20 + i) for i in range(3)]
    assert delivery_ids(app) == []  # no consumer yet
    consumer = consumers()
    add_consumer(pipeline, consumer.url)
    assert delivery_ids(app) == []

    assert ensure(app, batch=2) == {"backfilled": 2, "revived": 0}
    assert len(delivery_ids(app)) == 2
    assert ensure(app, batch=2) == {"backfilled": 1, "revived": 0}
    assert ensure(app, batch=2) == {"backfilled": 0, "revived": 0}  # idempotent
    ids = delivery_ids(app)
    assert len(ids) == 3
    assert sorted(ref for topic, ref in hints if topic == "hook_delivery") == ids
    for delivery_id in ids:
        assert deliver(app, delivery_id) == "delivered"
    assert sorted(r["json"]["sha256"] for r in consumer.requests) == sorted(s.sha256 for s in staged)

    # An asset archived now gets its delivery from the archive commit; the
    # backfill does not add a second one.
    archive(app, pipeline, "10.1234/after", seed=30)
    assert len(delivery_ids(app)) == 4
    assert ensure(app) == {"backfilled": 0, "revived": 0}
    assert len(delivery_ids(app)) == 4


def test_reconciler_backfills_after_a_restart(app, pipeline, consumers, make_broker):
    """The real tasks path: the periodic reconcile finds the gap and the
    deliveries go out through the worker."""
    archive(app, pipeline, "10.1234/old-1", seed=31)
    archive(app, pipeline, "10.1234/old-2", seed=32)
    consumer = consumers()
    add_consumer(pipeline, consumer.url)
    broker = make_broker()
    actors.reconcile.send()
    run_worker(broker)
    assert sorted(broker.recorder.names()) == ["deliver_hook", "deliver_hook", "reconcile"]
    assert len(consumer.requests) == 2
    assert sorted(r["state"] for r in rows(app, "SELECT state FROM hook_deliveries")) == [
        "delivered", "delivered"]


def test_disabled_consumer_is_skipped_and_reenabling_sends_everything_again(
        app, client, pipeline, consumers, hints):
    consumer = consumers()
    created = add_consumer(pipeline, consumer.url)
    path = f"/api/v1/admin/projects/{pipeline.project}/hooks/{created['consumer_id']}"
    archive(app, pipeline, "10.1234/while-on", seed=40)
    [first] = delivery_ids(app)
    assert pipeline.api.call("PATCH", path, {"enabled": False}).status_code == 200
    assert deliver(app, first) is None
    assert delivery(app, first)["state"] == "skipped"
    archive(app, pipeline, "10.1234/while-off", seed=41)
    assert delivery_ids(app) == [first]  # no delivery for a disabled consumer
    assert ensure(app) == {"backfilled": 0, "revived": 0}  # nor from the backfill
    assert consumer.requests == []

    # Skipped is not a failure: not in the failed filter nor the failure metric.
    assert body(admin_list(pipeline, "?state=failed"))["deliveries"] == []
    assert [d["state"] for d in body(admin_list(pipeline))["deliveries"]] == ["skipped"]
    assert hook_metrics(client, pipeline.project) == {"fleethq_hook_deliveries_failed": 0,
                                                      "fleethq_hook_deliveries_skipped": 1}

    assert pipeline.api.call("PATCH", path, {"enabled": True}).status_code == 200
    assert ensure(app) == {"backfilled": 1, "revived": 1}
    ids = delivery_ids(app)
    assert len(ids) == 2
    assert delivery(app, first)["state"] == "pending" and delivery(app, first)["tries"] == 0
    for delivery_id in ids:
        assert deliver(app, delivery_id) == "delivered"
    assert len(consumer.requests) == 2
    assert ensure(app) == {"backfilled": 0, "revived": 0}
    assert hook_metrics(client, pipeline.project) == {"fleethq_hook_deliveries_failed": 0,
                                                      "fleethq_hook_deliveries_skipped": 0}


def test_reenabling_after_retention_pruned_old_deliveries_resends_nothing_already_delivered(
        app, pipeline, consumers):
    """Re-enabling rescans only the assets archived since the consumer was
    disabled: an asset whose delivered row retention has pruned is not sent
    a second time."""
    consumer = consumers()
    created = add_consumer(pipeline, consumer.url)
    path = f"/api/v1/admin/projects/{pipeline.project}/hooks/{created['consumer_id']}"
    archive(app, pipeline, "10.1234/long-ago", seed=50)
    [old] = delivery_ids(app)
    assert deliver(app, old) == "delivered"
    assert ensure(app) == {"backfilled": 0, "revived": 0}  # the reconciler's tick passes it
    sql(app, "UPDATE hook_deliveries SET updated_at = now() - interval '30 days' WHERE id = :d", d=old)
    from app.ops import retention
    with app.app_context():
        assert retention.prune_hook_deliveries(14, 100) == 1
    assert delivery_ids(app) == []
    assert pipeline.api.call("PATCH", path, {"enabled": False}).status_code == 200
    archive(app, pipeline, "10.1234/while-off", seed=51)
    assert pipeline.api.call("PATCH", path, {"enabled": True}).status_code == 200
    assert ensure(app) == {"backfilled": 1, "revived": 0}
    [new] = delivery_ids(app)
    assert deliver(app, new) == "delivered"
    assert ensure(app) == {"backfilled": 0, "revived": 0}
    assert consumer.delivery_ids() == [str(old), str(new)]


def hook_metrics(client, project_id: str) -> dict[str, float]:
    from tests.support.metrics import samples
    return {name: value for name, labels, value in samples(client.get("/metrics").get_data(as_text=True))
            if name.startswith("fleethq_hook_deliveries_") and labels == {"project": project_id}}


def test_add_hook_command_takes_the_completion_timeout(app, pipeline):
    def add(*extra):
        return app.test_cli_runner().invoke(args=[
            "fleet", "add-hook", pipeline.project, "--name", "ocr",
            "--url", "https://ocr.example.org/hook", *extra])
    refused = add("--completion-timeout-seconds", "5")
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert refused.stderr.splitlines()[0] == (
        "error: invalid_request: completion_timeout_seconds must be an integer from 10 to 604800")
    made = add("--completion-timeout-seconds", "600")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["completion_timeout_seconds"] == 600
    assert json.loads(add().stdout)["completion_timeout_seconds"] == 3600


# ------------------------------------------------------ the outbound policy

REFUSED_HOOK_URLS = {
    "cloud metadata": "http://169.254.169.254/latest/meta-data/",
    "private": "http://10.0.0.1/hook",
    "IPv4-mapped loopback": "http://[::ffff:127.0.0.1]/hook",
    "a number for a host": "http://2130706433/hook",
    "hex parts": "http://0x7f.1/hook",
    "localhost and a database port": "http://localhost:5432/",
    "loopback": "http://127.0.0.1:8400/api/v1/admin/projects",
    "link-local IPv6": "http://[fe80::1]/hook",
    "CGNAT": "http://100.64.0.1/hook",
    "NAT64 of a private address": "http://[64:ff9b::a00:1]/hook",
    "6to4 of a private address": "http://[2002:a00:1::]/hook",
    "CR/LF": "https://hooks.example.org/in\r\nX-Injected: 1",
    "a space": "https://hooks.example.org/in put",
    "user info": "https://user:secret@hooks.example.org/in",
    "a backslash": "https://hooks.example.org\\@127.0.0.1/in",
    "not http": "ftp://hooks.example.org/in",
}


def test_hook_urls_into_refused_space_or_ambiguous_are_refused(app, pipeline, monkeypatch):
    """Without an allow-list, a consumer URL naming a non-public address, or
    one that URL parsers could read two ways, is refused at once, with the
    reason: the master would otherwise POST every archived asset there."""
    monkeypatch.setitem(app.config, "OUTBOUND_ALLOW", "")
    path = f"/api/v1/admin/projects/{pipeline.project}/hooks"
    failures = []
    for name, url in REFUSED_HOOK_URLS.items():
        response = pipeline.api.call("POST", path, {"name": "x", "url": url})
        if response.status_code != 400 or body(response)["error"]["details"].get("field") != "url":
            failures.append(f"{name}: {response.status_code} {body(response)}")
    assert not failures, "\n".join(failures)
    assert body(pipeline.api.call("GET", path))["consumers"] == []
    ok = pipeline.api.call("POST", path, {"name": "x", "url": "https://hooks.example.org/in"})
    assert ok.status_code == 201, body(ok)
    edited = pipeline.api.call("PATCH", f"{path}/{body(ok)['consumer_id']}", {"url": "http://10.9.8.7/"})
    assert edited.status_code == 400 and "not a public address" in body(edited)["error"]["message"]


def test_a_delivery_to_a_name_resolving_into_refused_space_sends_nothing(app, pipeline, consumers,
                                                                         monkeypatch):
    """The check that counts is at delivery: the name is resolved, the
    answer checked, and the connection made to the checked address. A
    consumer that now resolves to loopback (rebinding, or the allow-list
    shrank) gets nothing; the delivery records why and tries again later."""
    consumer = consumers(status=200)
    add_consumer(pipeline, consumer.url.replace("127.0.0.1", "localhost"))
    archive(app, pipeline, "10.1234/refused", seed=4)
    [delivery_id] = delivery_ids(app)
    monkeypatch.setitem(app.config, "OUTBOUND_ALLOW", "")
    assert deliver(app, delivery_id) == "pending"
    row = delivery(app, delivery_id)
    assert row["last_status"] is None and row["last_error"].startswith("refused: refusing 'localhost'")
    assert consumer.requests == []
    # Allowed again (a consumer on this host, named in OUTBOUND_ALLOW): delivered.
    monkeypatch.setitem(app.config, "OUTBOUND_ALLOW", "127.0.0.0/8,::1")
    assert deliver(app, delivery_id) == "delivered"
    assert len(consumer.requests) == 1


def test_a_consumer_redirect_is_not_followed(app, pipeline, consumers):
    """A 3xx is a failed try (status only): following it could lead the
    master anywhere the consumer points."""
    consumer = consumers(status=307)
    add_consumer(pipeline, consumer.url)
    archive(app, pipeline, "10.1234/redirect", seed=5)
    [delivery_id] = delivery_ids(app)
    assert deliver(app, delivery_id) == "pending"
    row = delivery(app, delivery_id)
    assert (row["last_status"], row["last_error"]) == (307, "HTTP 307")
    assert len(consumer.requests) == 1
