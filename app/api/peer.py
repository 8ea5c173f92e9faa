"""Whether the client of the current request is still there.

A long-polling claim may lease jobs long after its client went away (killed
during the poll). Leasing to a closed connection would keep those jobs
``wip`` for a whole lease and cost each a reset, so the claim route asks here
before and after leasing, and hands its answer over through
:func:`guarded_body`, which notices when the server could not write it.
"""
from __future__ import annotations

import socket
from typing import Callable, Iterator

from flask import request, stream_with_context

# Where the WSGI servers FleetHQ runs under expose the client socket.
_SOCKET_KEYS = ("gunicorn.socket", "werkzeug.socket")


def client_gone() -> bool:
    """True when the peer has closed its side of the connection.

    A non-blocking peek that returns no bytes means end of stream; a reset
    connection raises. Servers that expose no socket: assume the client is there.
    """
    sock = next((request.environ[k] for k in _SOCKET_KEYS if k in request.environ), None)
    if sock is None:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: still connected
    except ValueError:
        return False  # a TLS socket takes no recv flags: cannot tell, assume connected
    except OSError:
        return True   # reset, or the socket is already closed


def guarded_body(payload: bytes, on_undelivered: Callable[[], None]) -> Iterator[bytes]:
    """A response body that calls ``on_undelivered`` when the server stops
    before the payload was written (the write failed and it closed the body)."""
    def body():
        delivered = False
        try:
            yield payload
            delivered = True  # the server asked for more: the payload went out
        finally:
            if not delivered:
                on_undelivered()
    return stream_with_context(body())
