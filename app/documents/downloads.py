"""A document's file as an HTTP download under its own name (pages and API)."""
from __future__ import annotations

from urllib.parse import quote

from flask import Response

from app.storage import shared_store

CHUNK = 1024 * 1024


def file_response(config, object_key: str, media_type: str, name: str) -> Response:
    """Streams the object; raises StorageError before any byte if it cannot be opened."""
    handle = shared_store(config).open(object_key)

    def chunks():
        with handle:
            while block := handle.read(CHUNK):
                yield block
    # An ASCII fallback for old clients, the real name as RFC 6266's filename*.
    fallback = "".join(ch if ch.isascii() and ch.isprintable() and ch not in '"\\' else "_"
                       for ch in name)
    return Response(chunks(), mimetype=media_type, headers={
        "Content-Disposition": f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name)}",
        "X-Content-Type-Options": "nosniff"})
