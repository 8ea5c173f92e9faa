"""Raw client sockets for the slow-client tests (gunicorn direct, and the
documented proxy)."""
from __future__ import annotations

import socket


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True once the server closes the connection (end of stream, reset, or
    TLS ended abruptly) within ``within_s``, reading whatever it sent first."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True
