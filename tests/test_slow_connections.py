"""Slow clients cannot stall a master reached directly (issue 26 §4).

A real gunicorn as deployed (app/gunicorn_conf.py, app/web_worker.py) with
one worker of two threads and short deadlines. Before app/web_worker.py,
forty clients that each sent a byte of request header every second held
every thread, and a plain request waited until its client gave up.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from tests.gunicorn_master import Gunicorn
from tests.support.sockets import closed_by_server

HEADER_S, BODY_IDLE_S = 2, 2


@pytest.fixture(scope="module")
def server(app, database_url, tmp_path_factory):
    log = tmp_path_factory.mktemp("slow") / "gunicorn.log"
    master = Gunicorn({"DATABASE_URL": database_url, "GUNICORN_CMD_ARGS": "", "FLEETHQ_WEB_WORKERS": "1",
                       "FLEETHQ_WEB_THREADS": "2", "FLEETHQ_HEADER_TIMEOUT_S": str(HEADER_S),
                       "FLEETHQ_BODY_IDLE_S": str(BODY_IDLE_S)}, log)
    try:
        master.wait_ready()
        yield master
    finally:
        master.stop()


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def read_answer(sock: socket.socket) -> bytes:
    """One whole HTTP answer with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


def test_clients_trickling_their_headers_do_not_stall_the_master(server):
    slow = [connect(server) for _ in range(40)]
    for sock in slow:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    stop = threading.Event()

    def trickle():
        while not stop.is_set():
            for sock in slow:
                try:
                    sock.sendall(b"X-Slow: a\r\n")
                except OSError:
                    pass
            stop.wait(0.5)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(0.5)
        # Forty trickling clients, two threads: plain requests are answered
        # while the slow ones are still sending.
        for _ in range(5):
            assert requests.get(server.url + "/healthz", timeout=HEADER_S / 2).status_code == 200
        # And the slow ones are closed at their header deadline.
        assert all(closed_by_server(sock, HEADER_S + 5) for sock in slow)
    finally:
        stop.set()
        trickler.join()
        for sock in slow:
            sock.close()
    assert f"request header not complete within {HEADER_S:g} s" in server.log()


def test_a_header_in_pieces_within_the_deadline_is_served(server):
    with connect(server) as sock:
        for piece in (b"GET /healthz HT", b"TP/1.1\r\nHost: x\r", b"\n\r\n"):
            sock.sendall(piece)
            time.sleep(0.3)
        assert read_answer(sock).startswith(b"HTTP/1.1 200")


def test_kept_alive_connections_idle_longer_than_the_header_deadline_still_serve(server):
    with requests.Session() as session:
        assert session.get(server.url + "/healthz", timeout=5).status_code == 200
        time.sleep(HEADER_S + 1.5)  # idle time is the keep-alive's (75 s), not the header's
        answer = session.get(server.url + "/healthz", timeout=5)
        assert answer.status_code == 200
    # Pipelined: the second request arrives with the first, both answered.
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(sock).startswith(b"HTTP/1.1 200")
        assert read_answer(sock).startswith(b"HTTP/1.1 200")


def test_a_body_that_stalls_is_cut_at_its_idle_bound(server):
    with connect(server) as sock:
        sock.sendall(b"POST /api/v1/fleet/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"node_id\": ")
        # The thread reading it gives up after BODY_IDLE_S; the connection ends.
        assert closed_by_server(sock, BODY_IDLE_S + 10)
    assert f"request body paused longer than {BODY_IDLE_S:g} s" in server.log()
    # The master still answers.
    assert requests.get(server.url + "/healthz", timeout=5).status_code == 200
