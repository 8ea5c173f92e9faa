"""The documented reverse proxy, run as documented (issue 26 §4, issue 25 §2).

docs/deployment.md's nginx block is read from the page itself, only its
addresses, certificate and body-buffer directory replaced, and nginx runs it
in front of a gunicorn master as deployed. A worker on SavewebHQ's own
Python SDK keeps its one connection through the proxy while it works on a
job for 65 s (longer than SavewebHQ's idle keep-alive); meanwhile forty
clients trickle request headers and one stalls its body: the proxy answers
plain requests at once, cuts the trickling clients at the documented header
deadline (10 s) and the stalled body at its idle bound (60 s), and the
worker's completion goes through on the connection it kept.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import socket
import ssl
import select
import subprocess
import time
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import free_port
from tests.gunicorn_master import Gunicorn
from tests.helpers import stop_group
from tests.support.sockets import closed_by_server
from tests.savewebhq_programs import CLIENT_VERSION, one_job_project, python_sdk

DEPLOYMENT_DOC = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
HEADER_DEADLINE_S = 10   # client_header_timeout in the documented block
BODY_IDLE_S = 60         # client_body_timeout
PAUSE_S = 65             # longer than SavewebHQ's own idle keep-alive (60 s)


def documented_block() -> str:
    """The nginx block of the page's "The reverse proxy" section, verbatim."""
    section = DEPLOYMENT_DOC.read_text().split("## The reverse proxy", 1)[1]
    return section.split("```nginx\n", 1)[1].split("```", 1)[0]


def runnable_block(upstream_port: int, http_port: int, https_port: int, cert: Path, key: Path,
                   body_dir: Path) -> str:
    """The documented block with this host's addresses and files; nothing else changes."""
    block = documented_block()
    for old, new in (("server 127.0.0.1:8400;", f"server 127.0.0.1:{upstream_port};"),
                     ("listen 80;", f"listen 127.0.0.1:{http_port};"),
                     ("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;"),
                     ("/etc/letsencrypt/live/hq.example.org/fullchain.pem", str(cert)),
                     ("/etc/letsencrypt/live/hq.example.org/privkey.pem", str(key)),
                     ("/var/lib/nginx/fleethq-body", str(body_dir))):
        assert block.count(old) == 1, f"the documented nginx block no longer holds {old!r}"
        block = block.replace(old, new)
    # The IPv6 listens: a test host may have no IPv6 loopback.
    lines = block.splitlines()
    kept = [line for line in lines if not line.strip().startswith("listen [::]")]
    assert len(lines) - len(kept) == 2
    return "\n".join(kept)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "fullchain.pem", directory / "privkey.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


class Nginx:
    def __init__(self, directory: Path, upstream_port: int):
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.access(binary, os.X_OK):
            pytest.fail("nginx is required (make system-packages installs nginx-light)", pytrace=False)
        self.dir = directory
        self.cert, key = self_signed(directory)
        self.https_port, http_port = free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.https_port}"
        body_dir = directory / "fleethq-body"
        body_dir.mkdir(mode=0o700)
        server = runnable_block(upstream_port, http_port, self.https_port, self.cert, key, body_dir)
        temp = "\n".join(f"    {kind}_temp_path {directory / kind};" for kind in ("proxy", "fastcgi", "uwsgi", "scgi"))
        conf = directory / "nginx.conf"
        # As root, workers would otherwise run as nginx's user, who cannot
        # enter the test's private directories.
        conf.write_text(f"""{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
pid {directory / "nginx.pid"};
error_log {directory / "error.log"} info;
events {{ worker_connections 512; }}
http {{
    access_log {directory / "access.log"};
{temp}
{server}
}}
""")
        args = [binary, "-c", str(conf), "-p", str(directory), "-e", str(directory / "error.log")]
        checked = subprocess.run([*args, "-t"], capture_output=True, text=True)
        assert checked.returncode == 0, f"nginx refuses the documented block:\n{checked.stderr}"
        self.proc = subprocess.Popen([*args, "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, deadline_s: float = 20):
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"nginx exited:\n{self.error_log()}"
            try:
                if requests.get(self.url + "/healthz", verify=str(self.cert), timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        pytest.fail(f"nginx did not answer:\n{self.error_log()}")

    def error_log(self) -> str:
        path = self.dir / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self):
        stop_group(self.proc, 20)   # the master and its worker


@pytest.fixture
def proxied(app, database_url, tmp_path):
    master = Gunicorn({"DATABASE_URL": database_url, "GUNICORN_CMD_ARGS": ""}, tmp_path / "gunicorn.log")
    proxy = None
    try:
        master.wait_ready()
        proxy = Nginx(tmp_path, master.port)
        proxy.wait_ready()
        yield proxy
    finally:
        if proxy is not None:
            proxy.stop()
        master.stop()


def tls_connection(proxy: Nginx) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(proxy.cert))
    return context.wrap_socket(socket.create_connection(("127.0.0.1", proxy.https_port), timeout=30),
                               server_hostname="127.0.0.1")


def was_closed(sock: ssl.SSLSocket) -> bool:
    """Whether the proxy has ended the connection's request by now (closed,
    reset, or answered it, as with a 408)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    sock.setblocking(False)
    try:
        sock.recv(65536)
    except ssl.SSLWantReadError:
        return False          # only TLS's own records so far (session tickets)
    except OSError:
        pass                  # reset, or TLS ended abruptly
    finally:
        sock.settimeout(30)
    return True


def sent(sock: ssl.SSLSocket, data: bytes) -> bool:
    """False once the proxy no longer takes what the client sends."""
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def test_the_documented_proxy_keeps_a_workers_connection_and_cuts_slow_clients(app, proxied, tmp_path,
                                                                                monkeypatch):
    proxy = proxied
    sdk = python_sdk()
    # Every client here trusts the proxy's certificate: the SDK through its
    # default TLS context, requests through its own variable.
    monkeypatch.setenv("SSL_CERT_FILE", str(proxy.cert))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(proxy.cert))
    worker = one_job_project(app, proxy.url, tmp_path, "through-proxy")

    config = sdk.Config(proxy.url, worker, CLIENT_VERSION)
    with sdk.open_project_queue(config, "through-proxy") as queue:
        job = queue.claim(max_jobs=1)["jobs"][0]
        connection = queue._tracker._connection
        assert connection is not None and connection.sock is not None
        kept_socket = connection.sock
        idle_since = time.monotonic()

        # While the worker works on its job: one client stalls its body...
        stalled = tls_connection(proxy)
        stalled.sendall(b"POST /api/v1/fleet/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"x\": ")
        # ...and forty trickle their headers, a line every half second.
        slow = [tls_connection(proxy) for _ in range(40)]
        for sock in slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        trickling_since = time.monotonic()
        closed_at: dict[int, float] = {}
        answered = None
        while len(closed_at) < len(slow) and time.monotonic() < trickling_since + HEADER_DEADLINE_S + 5:
            for index, sock in enumerate(slow):
                if index not in closed_at and (was_closed(sock) or not sent(sock, b"X-Slow: a\r\n")):
                    closed_at[index] = time.monotonic() - trickling_since
            if answered is None and time.monotonic() > trickling_since + 2:
                answered = requests.get(proxy.url + "/healthz", verify=str(proxy.cert), timeout=5)
                assert answered.status_code == 200
                assert not closed_at, "trickling clients cut before the header deadline"
            time.sleep(0.5)
        for sock in slow:
            sock.close()
        assert answered is not None, "a plain request waited behind the trickling clients"
        assert len(closed_at) == len(slow), \
            f"{len(slow) - len(closed_at)} trickling clients still held past the header deadline"
        assert min(closed_at.values()) >= HEADER_DEADLINE_S - 1, sorted(closed_at.values())

        time.sleep(max(0.0, idle_since + BODY_IDLE_S - 5 - time.monotonic()))
        assert not closed_by_server(stalled, 0.01), "a pausing body is cut before its idle bound"
        assert closed_by_server(stalled, 10), "a body stalled past the documented idle bound is still held"
        stalled.close()
        time.sleep(max(0.0, idle_since + PAUSE_S - time.monotonic()))

        done = queue.complete([{"job_id": job["job_id"], "attempt_id": job["attempt_id"],
                                "outcome": {"kind": "success", "code": 200, "uri": None, "meta": {}},
                                "artifact_receipts": []}])
        assert done["results"][0]["status"] == "applied", done
        assert queue._tracker._connection is connection and connection.sock is kept_socket, \
            "the worker's connection did not survive its pause behind the proxy"
