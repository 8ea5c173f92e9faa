"""Configuration, result and internal failure types of the fetch ladder."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from workers.wire.failures import CHALLENGE, THROTTLED  # noqa: F401 (the ladder's codes too)

# Failure codes. The first seven are the ladder's classification (challenge
# and throttled are the site pushing back: workers.wire.failures); the last
# three are the DESIGN §6 codes for problems that are not the document's
# (bad job value, local disk, a bug or a broken PDF checker).
PAYWALL, NOT_FOUND, INVALID_PDF, TIMEOUT, NETWORK = (
    "paywall", "not_found", "invalid_pdf", "timeout", "network")
INVALID_IDENTIFIER, DISK, INTERNAL = "invalid_identifier", "disk", "internal"

STRATEGIES = ("direct", "landing", "browser")


@dataclass(frozen=True)
class FetchConfig:
    doi_resolver: str = "https://doi.org/"
    arxiv_base: str = "https://arxiv.org/"
    max_bytes: int = 100 * 1024 * 1024
    timeout_s: float = 60          # budget of each lane (HTTP lanes together, browser lane)
    max_redirects: int = 10
    user_agent: str = "FleetHQ-worker/1"
    use_browser: bool = True
    chromium_path: str = "/usr/bin/chromium"
    # Tests only: networks to treat as public although the rules would refuse
    # them (e.g. [ip_network("127.0.0.2/32")] for a local publisher). Only
    # addresses inside a listed network are let through; everything else
    # loopback/private/link-local stays refused.
    allow_addresses: list | tuple | None = None
    ca_bundle: str | None = None   # CA file for HTTPS; None = certifi's bundle

    def allowed_networks(self) -> tuple:
        return tuple(ipaddress.ip_network(n, strict=False) for n in (self.allow_addresses or ()))


@dataclass
class FetchResult:
    ok: bool
    path: str | None = None
    sha256: str | None = None
    size: int | None = None
    source_url: str | None = None
    strategy: str = "direct"
    error_code: str | None = None
    message: str = ""
    details: dict = field(default_factory=dict)


class FetchFailure(Exception):
    """A classified failure inside a lane; turned into a FetchResult at the top."""

    def __init__(self, code: str, message: str, **details):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class Blocked(FetchFailure):
    """A target address the SSRF rules refuse (reported as ``network``)."""

    def __init__(self, message: str, **details):
        super().__init__(NETWORK, message, blocked=True, **details)
