"""Whether the client of the current request is still there.

A long-polling claim may lease jobs long after its client went away (killed
during the poll). Leasing to a closed connection would keep those jobs
``wip`` for a whole lease and cost each a reset, so the claim route asks here
before and after leasing and gives the jobs back at once when the client is
gone. (A failed write of the answer itself is not watched: a write into a
socket whose peer has just closed usually succeeds into the kernel's buffer,
and a body generator that outlives its request would keep the request's
context and database session open.)
"""
from __future__ import annotations

import socket
from flask import request

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
