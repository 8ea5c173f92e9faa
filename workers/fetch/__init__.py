"""The worker's fetch ladder (DESIGN §9): job value in, verified PDF file out.

``fetch_document(value, dest_dir, cfg)`` tries, in order, a direct PDF over
the SSRF-safe HTTP client, the landing page's PDF links, and a headless
Chromium whose traffic all goes through that same client; it returns a
:class:`FetchResult` (``ok`` with the file, or an ``error_code``) and does
not raise for fetch problems. See docs/fetching.md.

Nothing here imports Flask or ``app``: the worker installs without them.
"""
from .chromium import CHROMIUM_FLAGS, browser_available, browser_status, close_browser
from .ladder import fetch_document, target_url
from .types import FetchConfig, FetchResult

__all__ = ["FetchConfig", "FetchResult", "fetch_document", "browser_available", "browser_status",
           "close_browser", "target_url", "CHROMIUM_FLAGS"]
