"""Two web instances behind a round-robin proxy, one PostgreSQL, one Redis,
uploads staged in S3 (moto over HTTP), a real ``dramatiq tasks`` process and
a clock; no two of them share a data directory.

What one instance keeps that the other needs lives in PostgreSQL: long-poll
wake-ups (NOTIFY), the worker-claim and dispatch buckets, the enrollment and
login limits, and the staged upload's location (an object key).
"""
from __future__ import annotations

import hashlib
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis
import requests

from app.storage import content_key
from tests.conftest import free_port
from tests.fleet_helpers import Node, new_identity, pdf_project
from tests.gunicorn_master import ROOT, Gunicorn
from tests.helpers import Api, body, db_rows, stop_group, wait_for
from tests.pdfs import make_pdf
from tests.roundrobin_proxy import ProxyProcess
from tests.support.archive import MotoServer, s3_client

BIN = os.path.dirname(sys.executable)


class Cluster:
    def __init__(self, database_url: str, redis_url: str, tmp_path):
        self.moto = MotoServer()
        self.moto.start()
        self.bucket = f"scale-{uuid.uuid4().hex[:12]}"
        s3_client(self.moto.url).create_bucket(Bucket=self.bucket)
        self.env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url,
                    "S3_BUCKET": self.bucket, "S3_ENDPOINT_URL": self.moto.url,
                    "S3_REGION": "us-east-1", "S3_ACCESS_KEY_ID": "test",
                    "S3_SECRET_ACCESS_KEY": "test", "S3_MAX_ATTEMPTS": "1",
                    "FLEETHQ_SPOOL_BACKEND": "s3", "FLEETHQ_SECRET_KEY": uuid.uuid4().hex,
                    "FLEETHQ_ENROLL_RATE_LIMIT": "4", "FLEETHQ_LOGIN_RATE_LIMIT": "4",
                    "FLEETHQ_LOG_JSON": "false",
                    "FLEETHQ_STUB_BROKER": "false", "PYTHONPATH": ROOT}
        self.dirs = {name: tmp_path / name for name in ("web1", "web2", "tasks")}
        self.webs = [Gunicorn({**self.env, "FLEETHQ_DATA_DIR": str(self.dirs[name])},
                              tmp_path / f"{name}.log") for name in ("web1", "web2")]
        for web in self.webs:
            web.wait_ready()
        self.proxy = ProxyProcess(free_port(), [w.url for w in self.webs], ROOT)
        tasks_env = {**os.environ, **self.env, "FLEETHQ_DATA_DIR": str(self.dirs["tasks"])}
        tasks_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.tasks_log = open(tmp_path / "tasks.log", "wb")
        self.tasks = subprocess.Popen(
            [os.path.join(BIN, "dramatiq"), "tasks:setup_broker", "--processes", "1",
             "--threads", "2"], cwd=ROOT, env=tasks_env, stdout=self.tasks_log,
            stderr=subprocess.STDOUT, start_new_session=True)
        # The clock re-sends archive commits the store refused (moto may
        # answer one of two concurrent copies onto one key 500), promptly.
        self.clock_log = open(tmp_path / "clock.log", "wb")
        self.clock = subprocess.Popen(
            [sys.executable, "-m", "tasks.clock"], cwd=ROOT,
            env={**tasks_env, "FLEETHQ_RECONCILE_EVERY_S": "2"}, stdout=self.clock_log,
            stderr=subprocess.STDOUT, start_new_session=True)
        self.tmp_path = tmp_path

    def kill_web(self, index: int) -> None:
        """kill -9 an instance: its gunicorn master and every worker."""
        web = self.webs[index]
        subprocess.run(["pkill", "-KILL", "-P", str(web.proc.pid)], check=False)
        web.proc.kill()
        web.proc.wait(timeout=20)
        wait_for(lambda: not listening(web.port), timeout=20, what="the killed instance's port to close")

    def stop(self) -> None:
        self.proxy.stop()
        for web in self.webs:
            web.stop()
        for proc in (self.clock, self.tasks):
            stop_group(proc)
        self.tasks_log.close()
        self.clock_log.close()
        self.moto.stop()

    def object_keys(self) -> list[str]:
        listed = s3_client(self.moto.url).list_objects_v2(Bucket=self.bucket)
        return sorted(o["Key"] for o in listed.get("Contents", ()))


@pytest.fixture(scope="module")
def cluster(app, database_url, redis_url, tmp_path_factory):
    """One cluster for the module (starting it costs seconds); the test that
    kills an instance runs last."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    queues = redis.Redis.from_url(redis_url)
    stale = queues.keys("dramatiq:*")
    if stale:
        queues.delete(*stale)
    made = Cluster(database_url, redis_url, tmp_path)
    yield made
    made.stop()
    stale = queues.keys("dramatiq:*")
    if stale:
        queues.delete(*stale)


def test_the_proxy_spreads_connections_over_both_instances(cluster, admin_token):
    for _ in range(4):
        with requests.Session() as session:
            api = Api(session, admin_token, base=cluster.proxy.url)
            assert api.call("GET", "/api/v1/whoami").status_code == 200
    served = cluster.proxy.served()
    assert sorted(served.values()) == [2, 2], served


def test_a_long_poll_on_one_instance_wakes_for_an_enqueue_on_the_other(cluster, admin_token):
    one, other = (Api(requests.Session(), admin_token, base=w.url) for w in cluster.webs)
    other.put_project("across")
    result = {}

    def wait():
        result["response"] = one.claim("across", max_jobs=1, wait_ms=20_000)
        result["answered_at"] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(1.0)  # the claim is asleep on instance 1
    enqueued_at = time.monotonic()
    assert other.enqueue("across", [{"id": "a", "value": "x"}]).status_code == 200
    thread.join(25)
    assert [j["id"] for j in body(result["response"])["jobs"]] == ["a"]
    woke_after = result["answered_at"] - enqueued_at
    assert woke_after < 5, f"the claim woke {woke_after:.1f} s after the enqueue"
    # Queue gauges come from PostgreSQL: both instances tell the same.
    for web in cluster.webs:
        metrics = requests.get(web.url + "/metrics", timeout=10).text
        assert 'fleethq_jobs{project="across",state="wip"} 1' in metrics


def test_limits_count_across_instances(cluster, admin_token, app):
    """Enrollment guesses and sign-in starts (limit 4 per window each), and a
    project's dispatch rate."""
    answers = []
    for n in range(5):
        web = cluster.webs[n % 2]
        node_id, secret = new_identity()
        answers.append(requests.post(web.url + "/api/v1/fleet/register", json={
            "id": node_id, "name": "guess", "enrollment_token": "fhqe_wrong" + "x" * 30,
            "secret": secret}, timeout=10).status_code)
    assert 429 not in answers[:4] and answers[4] == 429, answers
    # No GitHub app is configured here: a start that passes the limit is 404.
    starts = [requests.get(cluster.webs[n % 2].url + "/login/github", allow_redirects=False,
                           timeout=10).status_code for n in range(5)]
    assert starts == [404, 404, 404, 404, 429], starts

    one, other = (Api(requests.Session(), admin_token, base=w.url) for w in cluster.webs)
    one.put_project("paced", dispatch_qps=0.2)
    one.enqueue("paced", [{"id": str(i), "value": str(i)} for i in range(3)])
    assert len(body(one.claim("paced", worker_id="w1", max_jobs=1))["jobs"]) == 1
    refused = other.claim("paced", worker_id="w2", max_jobs=1)
    assert refused.status_code == 429, body(refused)
    assert body(refused)["error"]["code"] == "project_dispatch_rate_limited"


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _with_retries(call, tries: int = 3):
    """As a worker does: a connection that broke is tried again."""
    for attempt in range(tries):
        try:
            return call()
        except requests.ConnectionError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)


def _paper(tmp_path, seed: int) -> bytes:
    path = tmp_path / f"paper-{seed}.pdf"
    make_pdf(path, target_bytes=200_000, seed=seed)
    return path.read_bytes()


def _claimed_paper(cluster, app, admin_token, project: str, seed: int):
    """A pdf project with one paper, claimed by a node talking to instance 1;
    returns the node, the job and the PDF's bytes."""
    admin = Api(requests.Session(), admin_token, base=cluster.proxy.url)
    pdf_project(admin, project, max_in_flight=10, max_worker_in_flight=10)
    node = Node(requests.Session(), app, base=cluster.webs[0].url)
    assert node.heartbeat().status_code == 200
    admin.enqueue(project, [{"value": f"10.1234/{project}"}])
    [job] = body(node.claim(project))["jobs"]
    return node, job, _paper(cluster.tmp_path, seed)


def test_an_upload_to_one_instance_is_archived_by_a_tasks_process_sharing_no_disk(
        cluster, app, admin_token, database_url):
    node, job, data = _claimed_paper(cluster, app, admin_token, "papers", 1)
    accepted = node.upload(job["attempt_id"], data)
    assert accepted.status_code == 202, body(accepted)
    # The receipt, asked of the other instance, turns done once the tasks
    # process (its own data directory) archived the staged object.
    other = Node.__new__(Node)
    other.client, other.base, other.node_id, other.secret = (
        requests.Session(), cluster.webs[1].url, node.node_id, node.secret)
    receipt = wait_for(lambda: (r := body(other.receipt(job["attempt_id"], wait_ms=5000)))
                       ["state"] == "done" and r, timeout=60, what="the done receipt")
    assert receipt["sha256"] == hashlib.sha256(data).hexdigest()
    assert content_key(receipt["sha256"]) in cluster.object_keys()
    assert not [k for k in cluster.object_keys() if k.startswith("staging/")]
    for name in ("web1", "web2", "tasks"):
        spool = cluster.dirs[name] / "spool"
        assert not spool.exists() or not any(spool.iterdir()), (name, list(spool.iterdir()))


def test_identical_uploads_to_both_instances_at_once_are_one_object(cluster, app, admin_token):
    admin = Api(requests.Session(), admin_token, base=cluster.proxy.url)
    pdf_project(admin, "twins", max_in_flight=10, max_worker_in_flight=10)
    admin.enqueue("twins", [{"value": "10.1234/twin-a"}, {"value": "10.1234/twin-b"}])
    nodes = [Node(requests.Session(), app, base=web.url) for web in cluster.webs]
    jobs = []
    for node in nodes:
        assert node.heartbeat().status_code == 200
        [job] = body(node.claim("twins", max_jobs=1))["jobs"]
        jobs.append(job)
    data = _paper(cluster.tmp_path, 4)
    digest = hashlib.sha256(data).hexdigest()
    start, answers = threading.Barrier(2), [None, None]

    def upload(n):
        start.wait()
        answers[n] = nodes[n].upload(jobs[n]["attempt_id"], data)
    threads = [threading.Thread(target=upload, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert None not in answers, "an upload got no answer within 60 s"
    assert [a.status_code for a in answers] == [202, 202], [body(a) for a in answers]
    for node, job in zip(nodes, jobs):
        wait_for(lambda node=node, job=job: body(node.receipt(job["attempt_id"], wait_ms=5000))
                 ["state"] == "done", timeout=60, what="both done receipts")
    assets = db_rows(app, "SELECT object_key FROM assets ORDER BY job_id")
    assert assets == [{"object_key": content_key(digest)}] * 2
    assert [k for k in cluster.object_keys() if k.startswith(("staging/", content_key(digest)))] \
        == [content_key(digest)]


def test_an_instance_killed_mid_upload_and_the_retry_on_the_other_is_archived_once(
        cluster, app, admin_token, database_url):
    node, job, data = _claimed_paper(cluster, app, admin_token, "killed", 2)
    digest = hashlib.sha256(data).hexdigest()
    # The first try sends its headers and a first part of the body, then the
    # instance dies under it.
    host, port = cluster.webs[0].url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("PUT", f"/api/v1/fleet/uploads/{job['attempt_id']}")
    for name, value in {**node.headers, "X-PDF-SHA256": digest, "X-PDF-Size": str(len(data)),
                        "Content-Length": str(len(data)), "Content-Type": "application/pdf"}.items():
        conn.putheader(name, value)
    conn.endheaders()
    conn.send(data[:65536])
    wait_for(lambda: db_rows(app, "SELECT 1 FROM uploads WHERE attempt_id = :a AND state = 'uploading'",
                             a=int(job["attempt_id"])), timeout=20, what="the admitted upload")
    cluster.kill_web(0)
    with pytest.raises(OSError):
        conn.send(data[65536:])
        conn.getresponse()
    conn.close()

    # The worker's retry of the same attempt, through the proxy: instance 1
    # refuses connections, so it lands on instance 2.
    node.base = cluster.proxy.url
    retried = _with_retries(lambda: node.upload(job["attempt_id"], data))
    assert retried.status_code == 202, body(retried)
    receipt = wait_for(lambda: (r := body(node.receipt(job["attempt_id"], wait_ms=5000)))
                       ["state"] == "done" and r, timeout=60, what="the done receipt")
    assert receipt["sha256"] == digest
    assets = db_rows(app, "SELECT object_key FROM assets WHERE job_id = :j", j=job["job_id"])
    assert assets == [{"object_key": content_key(digest)}]
    uploads = db_rows(app, "SELECT state, generation FROM uploads WHERE attempt_id = :a",
                      a=int(job["attempt_id"]))
    assert uploads == [{"state": "done", "generation": 2}]
    assert content_key(digest) in cluster.object_keys()
    assert not [k for k in cluster.object_keys() if k.startswith("staging/")]
