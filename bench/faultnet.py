"""A faulty network between workers and the master, and the history it saw.

``FaultyNet`` is an HTTP/1.1 proxy on loopback (a thread per client
connection, a connection of its own to the master for each). Every request
the fleet sends passes through it, and it may, at the rate and with the
kinds it is given:

- ``drop_request``: read the request, never forward it, reset the client;
- ``lost_ack``: forward it, let the master answer (and commit), then reset
  the client instead of answering: the worker does not know it succeeded;
- ``duplicate``: forward it twice, answer the client with the second answer;
- ``late``: reset the client at once and deliver the request to the master
  seconds later, after the worker's retry (requests reordered);
- ``delay``: hold the request, then the answer, up to a second or two each;
- ``reset_upload``: send the master the headers and half the body of an
  upload, then reset both sides;

and ``partition(seconds, kind)`` cuts the fleet off for a while: each
connection reset at once (``reset``) or held without an answer until the
partition ends (``blackhole``).

Each exchange is appended to the history (JSON lines): when the request
left and the answer came, the method and path, the status, whether the
client got the answer, the fault, and what a checker needs of the bodies
(claimed jobs and their leases, outcome items and results, heartbeat lease
renewals, upload and receipt states). bench/netfaults.py reads it back.

No third-party proxy fits: toxiproxy and its kin cut TCP streams, blind to
where one HTTP answer ends, so "the master answered and committed, the
worker never heard" cannot be said with them.
"""
from __future__ import annotations

import http.client
import json
import random
import re
import socket
import struct
import threading
import time
from collections import Counter

FAULTS = ("drop_request", "lost_ack", "duplicate", "late", "delay", "reset_upload")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
        "content-length"}
_UPLOAD = re.compile(r"^/api/v1/fleet/uploads/([^/?]+)(/text)?$")
_RECEIPT = re.compile(r"^/api/v1/fleet/receipts/([^/?]+)")
_SKIP = re.compile(r"^/api/v1/fleet/attempts/([^/?]+)/skip$")
_OUTCOME = re.compile(r"^/api/v1/projects/[^/]+/jobs/(claim|complete|fail|extend-lease)$")


class History:
    """The exchanges seen, one JSON object per line, numbered."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "w", buffering=1 << 20)
        self._lock = threading.Lock()
        self.count = 0

    def record(self, entry: dict) -> None:
        with self._lock:
            if self._file.closed:
                return
            self.count += 1
            entry["i"] = self.count
            self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _essentials(method: str, path: str, request_body: bytes, status: int | None, answer: bytes) -> dict:
    """What the checker needs of one exchange's bodies (the rest is not kept:
    a million exchanges must fit on disk)."""
    out: dict = {}
    route = path.split("?", 1)[0]
    match = _OUTCOME.match(route)
    try:
        request_json = json.loads(request_body) if request_body and match else None
        answer_json = json.loads(answer) if answer and status is not None and status < 300 else None
    except ValueError:
        return {"unparsed": True}
    if match:
        kind = match.group(1)
        out["op"] = kind
        if kind == "claim" and answer_json:
            out["jobs"] = [[j["job_id"], str(j["attempt_id"]), j.get("lease_expires_at")]
                           for j in answer_json.get("jobs", [])]
        elif kind != "claim":
            if request_json:
                out["items"] = [[it.get("job_id"), str(it.get("attempt_id")),
                                 (it.get("outcome") or {}).get("kind") or it.get("retryable")]
                                for it in request_json.get("items", [])]
            if answer_json:
                out["results"] = [[r["job_id"], str(r["attempt_id"]), r["status"], r.get("job_status"),
                                   r.get("lease_expires_at")] for r in answer_json.get("results", [])]
        return out
    if route == "/api/v1/fleet/heartbeat":
        out["op"] = "heartbeat"
        if answer_json:
            out["leases"] = answer_json.get("lease_expires") or {}
        return out
    for op, pattern in (("upload", _UPLOAD), ("receipt", _RECEIPT), ("skip", _SKIP)):
        found = pattern.match(route)
        if found:
            out["op"] = "upload_text" if op == "upload" and found.group(2) else op
            out["attempt"] = found.group(1)
            if answer_json and "state" in answer_json:
                out["state"] = answer_json["state"]
                out["job"] = answer_json.get("job_id")
            return out
    out["op"] = "other"
    return out


class _Request:
    def __init__(self, method: str, target: str, version: str, headers: list, body: bytes):
        self.method, self.target, self.version, self.headers, self.body = method, target, version, headers, body


def _read_request(rfile) -> _Request | None:
    line = rfile.readline(65537)
    if not line:
        return None
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3:
        return None
    headers = []
    while True:
        header = rfile.readline(65537)
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    lower = {k.lower(): v for k, v in headers}
    if "chunked" in lower.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size = int(rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            body += rfile.read(size)
            rfile.readline()
        body = bytes(body)
    else:
        length = int(lower.get("content-length") or 0)
        body = rfile.read(length) if length else b""
        if len(body) < length:
            return None
    return _Request(parts[0], parts[1], parts[2], headers, body)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, as a broken network path looks to the peer."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class FaultyNet:
    def __init__(self, upstream_port: int, history: History, *, seed: int = 1, rate: float = 0.0,
                 kinds: tuple = FAULTS, upstream_timeout: float = 120):
        self.upstream_port = upstream_port
        self.history = history
        self.rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.rate, self.kinds = rate, kinds
        self.upstream_timeout = upstream_timeout
        self.injected: Counter = Counter()
        self._partition_until, self._partition_kind = 0.0, "reset"
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._conn_ids = 0
        self._late_threads: list[threading.Thread] = []

    # -- control ----------------------------------------------------------------

    def start(self) -> "FaultyNet":
        threading.Thread(target=self._accept, daemon=True, name="faultnet-accept").start()
        return self

    def stop(self) -> None:
        """No more connections; requests still to be delivered late are
        delivered (and recorded) before this returns."""
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        for late in self._late_threads:
            late.join(timeout=30)

    def partition(self, seconds: float, kind: str = "reset") -> None:
        """Cut the fleet off for ``seconds`` (returns at once)."""
        self._partition_kind = kind
        self._partition_until = time.monotonic() + seconds
        self.injected[f"partition_{kind}"] += 1

    def partitioned(self) -> bool:
        return time.monotonic() < self._partition_until

    def _chance(self) -> float:
        with self._rng_lock:
            return self.rng.random()

    def _pick(self, request: _Request) -> str | None:
        # Uploads are few beside the JSON calls: they meet faults four times
        # as often, half of them a reset half-way.
        upload = request.method == "PUT" and len(request.body) > 2048
        with self._rng_lock:
            if self.rate <= 0 or self.rng.random() >= self.rate * (4 if upload else 1):
                return None
            if upload and "reset_upload" in self.kinds and self.rng.random() < 0.5:
                return "reset_upload"
            kinds = [k for k in self.kinds if k != "reset_upload"]
            return self.rng.choice(kinds) if kinds else None

    # -- the proxy ----------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._conn_ids += 1
            threading.Thread(target=self._serve, args=(client, self._conn_ids), daemon=True).start()

    def _upstream(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=self.upstream_timeout)

    def _serve(self, client: socket.socket, conn_id: int) -> None:
        rfile = client.makefile("rb")
        upstream = self._upstream()
        try:
            while not self._closed.is_set():
                if self.partitioned() and self._cut(client, conn_id):
                    return
                try:
                    request = _read_request(rfile)
                except (OSError, ValueError):
                    return
                if request is None:
                    return
                if self.partitioned() and self._cut(client, conn_id, request):
                    return
                fault = self._pick(request)
                if fault:
                    self.injected[fault] += 1
                if not self._exchange(client, conn_id, upstream, request, fault):
                    return
        finally:
            upstream.close()
            try:
                rfile.close()
            except OSError:
                pass
            _reset(client)

    def _cut(self, client: socket.socket, conn_id: int, request: _Request | None = None) -> bool:
        """The partition: reset now, or hold the connection silent until it ends."""
        if self._partition_kind == "blackhole":
            while self.partitioned() and not self._closed.is_set():
                time.sleep(0.2)
        if request is not None:
            now = time.time()
            self.history.record({"c": conn_id, "t0": now, "t1": now, "m": request.method, "p": request.target,
                                 "s": None, "d": False, "f": f"partition_{self._partition_kind}",
                                 **_essentials(request.method, request.target, request.body, None, b"")})
        return True

    def _forward(self, upstream, request: _Request):
        headers = {k: v for k, v in request.headers if k.lower() not in _HOP}
        headers["Content-Length"] = str(len(request.body))
        upstream.request(request.method, request.target, body=request.body, headers=headers)
        answer = upstream.getresponse()
        return answer.status, answer.reason, answer.getheaders(), answer.read()

    def _exchange(self, client, conn_id: int, upstream, request: _Request, fault: str | None) -> bool:
        """One request; False when the client connection is over."""
        entry = {"c": conn_id, "m": request.method, "p": request.target, "f": fault}
        if fault == "drop_request":
            now = time.time()
            self.history.record({**entry, "t0": now, "t1": now, "s": None, "d": False,
                                 **_essentials(request.method, request.target, request.body, None, b"")})
            return False
        if fault == "late":
            late = threading.Thread(target=self._late, args=(conn_id, request), daemon=True)
            self._late_threads.append(late)
            late.start()
            return False
        if fault == "reset_upload":
            self._half_upload(conn_id, request)
            return False
        if fault == "delay":
            time.sleep(self._chance() * 1.5)
        t0 = time.time()
        try:
            if fault == "duplicate":
                first = self._forward(upstream, request)
                self.history.record({**entry, "t0": t0, "t1": time.time(), "s": first[0], "d": False,
                                     **_essentials(request.method, request.target, request.body, first[0], first[3])})
                t0 = time.time()
            status, reason, headers, body = self._forward(upstream, request)
        except (OSError, http.client.HTTPException):
            # The master went away mid-request (a restart): the client sees
            # its connection drop, as it would.
            self.history.record({**entry, "t0": t0, "t1": time.time(), "s": None, "d": False,
                                 "f": fault or "upstream_gone",
                                 **_essentials(request.method, request.target, request.body, None, b"")})
            return False
        t1 = time.time()
        delivered = fault != "lost_ack"
        if delivered:
            if fault == "delay":
                time.sleep(self._chance() * 1.5)
            delivered = self._answer(client, status, reason, headers, body)
        self.history.record({**entry, "t0": t0, "t1": t1, "s": status, "d": delivered,
                             **_essentials(request.method, request.target, request.body, status, body)})
        return delivered

    def _answer(self, client, status: int, reason: str, headers: list, body: bytes) -> bool:
        head = [f"HTTP/1.1 {status} {reason}"]
        head += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP]
        head += [f"Content-Length: {len(body)}", "Connection: keep-alive", "", ""]
        try:
            client.sendall("\r\n".join(head).encode("latin-1") + body)
            return True
        except OSError:
            return False

    def _late(self, conn_id: int, request: _Request) -> None:
        time.sleep(1 + self._chance() * 4)
        upstream = self._upstream()
        t0 = time.time()
        try:
            status, _, _, body = self._forward(upstream, request)
        except (OSError, http.client.HTTPException):
            status, body = None, b""
        finally:
            upstream.close()
        self.history.record({"c": conn_id, "m": request.method, "p": request.target, "f": "late", "t0": t0,
                             "t1": time.time(), "s": status, "d": False,
                             **_essentials(request.method, request.target, request.body, status, body)})

    def _half_upload(self, conn_id: int, request: _Request) -> None:
        t0 = time.time()
        try:
            with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10) as sock:
                head = [f"{request.method} {request.target} HTTP/1.1"]
                head += [f"{k}: {v}" for k, v in request.headers if k.lower() not in _HOP]
                head += [f"Content-Length: {len(request.body)}", "", ""]
                sock.sendall("\r\n".join(head).encode("latin-1") + request.body[:len(request.body) // 2])
                time.sleep(0.2)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.history.record({"c": conn_id, "m": request.method, "p": request.target, "f": "reset_upload",
                             "t0": t0, "t1": time.time(), "s": None, "d": False,
                             **_essentials(request.method, request.target, request.body, None, b"")})
