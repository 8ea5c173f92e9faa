"""gunicorn's gthread worker with bounded reads, for a master reached
directly (no proxy in front to bound them).

gthread hands a connection to a thread as soon as it is readable, and the
thread then reads the request header in blocking mode with no time limit:
forty clients that each sent a byte of header now and then held every
thread of a default master (2 workers × 16), and nothing else was answered.
Here:

- the header of each request is gathered by the worker's poller, without a
  thread (read at once when it has arrived, as it mostly has), and handed to
  a thread only once it is complete (or larger than
  any ordinary header). It must be complete within
  ``FLEETHQ_HEADER_TIMEOUT_S`` (default 10 s) of the connection (or, on a
  kept-alive connection, of the request's first byte), like nginx's
  ``client_header_timeout``; past that the connection is closed;
- in the thread, the body may pause at most ``FLEETHQ_BODY_IDLE_S``
  (default 60 s) between two pieces, like nginx's ``client_body_timeout``;
  past that the read ends as if the client had closed the connection (the
  app sees a short body: an upload is interrupted and its reservation
  freed) and the connection is not kept alive. Any header read left to the
  thread (TLS terminated by gunicorn, an unusually large header) keeps the
  header's deadline.

Each closing logs one line. Writes are not bounded here: a slow reader of a
large download is the socket's business.
"""
from __future__ import annotations

import collections
import logging
import os
import selectors
import socket
import time
from functools import partial

from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import ThreadWorker

log = logging.getLogger("fleethq.web")

# A header is handed to a thread once complete or this large (the parser
# then reads the rest of it, under the same deadline, and applies gunicorn's
# own limits).
GATHER_LIMIT = 64 * 1024
END_OF_HEADER = b"\r\n\r\n"


def _seconds(name: str, default: float) -> float:
    value = float(os.environ.get(name) or default)
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds")
    return value


class BoundedReadsWorker(ThreadWorker):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_timeout_s = _seconds("FLEETHQ_HEADER_TIMEOUT_S", 10)
        self.body_idle_s = _seconds("FLEETHQ_BODY_IDLE_S", 60)
        # Connections whose header the poller is gathering, oldest first
        # (each deadline is its start plus the same timeout).
        self.gathering: collections.deque = collections.deque()

    # -- in the poller (main thread) ------------------------------------------

    def enqueue_req(self, conn):
        """A connection with a request to read: gather its header first
        (the hand-over to a thread, once it is complete, is _read_header's)."""
        conn.fleethq_header_deadline = time.monotonic() + self.header_timeout_s
        if not self._gathers(conn):
            super().enqueue_req(conn)
            return
        conn.fleethq_head = bytearray()
        conn.sock.setblocking(False)
        self.gathering.append(conn)
        # A kept-alive connection comes here because its request arrived:
        # mostly the whole header is there already, and no poller round is needed.
        if not self._read_header(conn):
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_header_bytes, conn))

    def _gathers(self, conn) -> bool:
        if self.cfg.is_ssl or getattr(conn, "is_http2", False):
            return False  # TLS records or frames, not a header to look for
        if negotiation.prior_knowledge_allowed(self.cfg, conn.client):
            return False
        # A request already read ahead (pipelined behind the last one) is
        # in the parser's buffer, not on the socket.
        return not (conn.parser is not None and conn.parser.unreader.buf.getvalue())

    def _on_header_bytes(self, conn, sock):
        self._read_header(conn)

    def _read_header(self, conn) -> bool:
        """Read what has arrived; True once the connection is no longer
        gathering (its header went to a thread, or the client went away)."""
        try:
            data = conn.sock.recv(GATHER_LIMIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:  # the client went away before a whole header
            self._drop(conn)
            return True
        head = conn.fleethq_head
        start = max(0, len(head) - len(END_OF_HEADER) + 1)
        head += data
        if END_OF_HEADER not in head[start:] and len(head) < GATHER_LIMIT:
            return False
        self._unregister(conn)
        self.gathering.remove(conn)
        conn.data_ready = True  # handle() need not wait for data
        super().enqueue_req(conn)
        return True

    def _unregister(self, conn):
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass  # not registered (yet)

    def _drop(self, conn, why: str | None = None):
        self._unregister(conn)
        self.gathering.remove(conn)
        if why:
            log.info("closing a connection from %s: %s", _peer(conn.client), why)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        while self.gathering and self.gathering[0].fleethq_header_deadline <= now:
            self._drop(self.gathering[0],
                       f"request header not complete within {self.header_timeout_s:g} s")

    # -- in a thread ----------------------------------------------------------

    def handle(self, conn):
        conn.fleethq_reading_header = True
        if not getattr(conn, "fleethq_bounded", False):
            conn.fleethq_bounded = True
            conn.fleethq_timed_out = False
            init = conn.init

            def bounded_init():
                init()
                if conn.parser is not None and not conn.is_http2:
                    _bound_reads(conn, self.body_idle_s)
                    head, conn.fleethq_head = getattr(conn, "fleethq_head", None), None
                    if head:
                        conn.parser.unreader.unread(bytes(head))
            conn.init = bounded_init
        return super().handle(conn)

    def handle_request(self, req, conn):
        conn.fleethq_reading_header = False  # from here on, reads are the body's
        return super().handle_request(req, conn)


def _bound_reads(conn, body_idle_s: float) -> None:
    unreader = conn.parser.unreader
    if getattr(unreader, "fleethq_bounded", False):
        return
    unreader.fleethq_bounded = True
    sock, read = unreader.sock, unreader.chunk

    def timed_out(what: str) -> bytes:
        conn.fleethq_timed_out = True
        log.info("closing a connection from %s: %s", _peer(conn.client), what)
        try:
            # Later reads see the end of the stream at once, so gunicorn
            # does not keep the connection alive or parse what follows.
            sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass
        return b""

    def bounded_chunk(size_hint=None):
        if conn.fleethq_timed_out:
            return b""
        header = conn.fleethq_reading_header
        left = conn.fleethq_header_deadline - time.monotonic() if header else body_idle_s
        what = ("request header not complete within its deadline" if header
                else f"request body paused longer than {body_idle_s:g} s")
        if left <= 0:
            return timed_out(what)
        sock.settimeout(left)
        try:
            return read(size_hint)
        except TimeoutError:
            return timed_out(what)
        finally:
            try:
                sock.settimeout(None)  # blocking again: writes are not bounded here
            except OSError:
                pass

    unreader.chunk = bounded_chunk


def _peer(client) -> str:
    if isinstance(client, (tuple, list)) and client:
        return str(client[0])
    return str(client or "?")
