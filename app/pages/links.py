"""The master's address as workers and browsers outside should use it.

Behind a TLS proxy the request's own host is the proxy's backend address
(``http://127.0.0.1:8000``), which a worker refuses and GitHub does not
know: ``PUBLIC_URL`` wins whenever it is set.
"""
from __future__ import annotations

from flask import current_app, request


def master_url() -> str:
    """``PUBLIC_URL`` without its trailing slash, else the request's root URL."""
    public = current_app.config.get("PUBLIC_URL")
    return (public or request.url_root).rstrip("/")
