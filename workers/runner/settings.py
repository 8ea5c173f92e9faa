"""Settings of ``fleethq-worker run``: flags, each with a FLEETHQ_* environment
twin (the container image is configured through the environment alone).

A flag given on the command line wins over the environment.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

GiB = 1024**3
MiB = 1024**2


def default_client_version() -> str:
    try:
        return "fleethq-worker/" + metadata.version("fleethq")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "fleethq-worker/0+unknown"


@dataclass
class Settings:
    master: str
    volume: Path
    projects: list[str]
    enroll: str | None = None
    concurrency: int = 2
    browser_concurrency: int = 1
    client_version: str = field(default_factory=default_client_version)
    allow_http: bool = False
    name: str = field(default_factory=socket.gethostname)
    heartbeat_s: float = 10.0
    lease_s: int = 120
    spool_max_bytes: int = 2 * GiB
    min_free_bytes: int = 1 * GiB
    retention_s: float = 24 * 3600
    # Fetch ladder (workers.fetch.FetchConfig).
    doi_resolver: str = "https://doi.org/"
    arxiv_base: str = "https://arxiv.org/"
    use_browser: bool = True
    chromium_path: str = "/usr/bin/chromium"
    fetch_timeout_s: float = 60.0
    max_pdf_bytes: int = 100 * MiB
    allow_networks: list[str] | None = None   # test allow-list; None = public addresses only
    # What a claimed job is: "fetch" (download a paper) or "ocr" (a derived
    # job: OCR its source with OCRmyPDF, workers/runner/ocr_task.py).
    task: str = "fetch"
    ocr_languages: str = "eng"               # checked at start: the packs this worker must have


# (flag, env, type, default, help). One table so flags, environment and the
# docs cannot drift apart.
def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _list(raw: str) -> list[str]:
    return [part for part in raw.replace(",", " ").split() if part]


def _networks(raw: str) -> list[str]:
    nets = _list(raw)
    for net in nets:
        ipaddress.ip_network(net, strict=False)  # ValueError names the bad one
    return nets


OPTIONS = [
    ("--master", "FLEETHQ_MASTER", str, None, "base URL of the master (https://…)"),
    ("--volume", "FLEETHQ_VOLUME", Path, None, "worker volume: identity, journal, ready PDFs"),
    ("--enroll", "FLEETHQ_ENROLL", str, None, "enrollment credential (fhqe_…), first start only"),
    ("--project", "FLEETHQ_PROJECTS", _list, None, "pdf project(s) to work on (repeatable; env: comma list)"),
    ("--concurrency", "FLEETHQ_CONCURRENCY", int, 2, "downloads at once"),
    ("--browser-concurrency", "FLEETHQ_BROWSER_CONCURRENCY", int, 1,
     "browser-lane downloads at once (one Chromium each, ~300 MB)"),
    ("--client-version", "FLEETHQ_CLIENT_VERSION", str, None, "X-Client-Version sent to the master"),
    ("--name", "FLEETHQ_WORKER_NAME", str, None, "display name given at registration (default: hostname)"),
    ("--heartbeat-seconds", "FLEETHQ_HEARTBEAT_SECONDS", float, 10.0, "heartbeat interval"),
    ("--lease-seconds", "FLEETHQ_LEASE_SECONDS", int, 120, "lease asked for at claim time"),
    ("--spool-max-bytes", "FLEETHQ_SPOOL_MAX_BYTES", int, 2 * GiB, "no claims while ready files use more"),
    ("--min-free-bytes", "FLEETHQ_MIN_FREE_BYTES", int, 1 * GiB, "no claims with less free disk on the volume"),
    ("--retention-hours", "FLEETHQ_RETENTION_HOURS", float, 24.0, "ready files older than this are dropped"),
    ("--doi-resolver", "FLEETHQ_DOI_RESOLVER", str, "https://doi.org/", "DOI resolver base URL"),
    ("--arxiv-base", "FLEETHQ_ARXIV_BASE", str, "https://arxiv.org/", "arXiv base URL"),
    ("--chromium", "FLEETHQ_CHROMIUM", str, "/usr/bin/chromium", "Chromium binary for the browser lane"),
    ("--fetch-timeout", "FLEETHQ_FETCH_TIMEOUT", float, 60.0, "seconds per fetch request"),
    ("--max-pdf-bytes", "FLEETHQ_MAX_PDF_BYTES", int, 100 * MiB, "largest PDF fetched"),
    ("--task", "FLEETHQ_TASK", str, "fetch", "fetch (download papers) or ocr (OCR derived jobs)"),
    ("--ocr-languages", "FLEETHQ_OCR_LANGUAGES", str, "eng",
     "ocr task: Tesseract packs checked at start (e.g. eng+pol); a job needing more fails over"),
    ("--allow-networks", "FLEETHQ_FETCH_ALLOW_NETWORKS", _networks, None,
     "TESTS ONLY: CIDRs the fetch client may reach besides public addresses"),
]
BOOL_OPTIONS = [
    ("--allow-http", "FLEETHQ_ALLOW_HTTP", False, "allow plain http to the master (trusted networks only)"),
    ("--no-browser", "FLEETHQ_NO_BROWSER", False, "never start Chromium (HTTP lanes only)"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, env, _kind, _default, text in OPTIONS:
        action = "append" if flag == "--project" else "store"
        parser.add_argument(flag, action=action, default=None, help=f"{text} [env {env}]")
    for flag, env, _default, text in BOOL_OPTIONS:
        parser.add_argument(flag, action="store_true", default=None, help=f"{text} [env {env}]")


def resolve(args: argparse.Namespace, environ=os.environ) -> Settings:
    """Merge flags and environment; raise ValueError naming the bad setting."""
    values: dict = {}
    for flag, env, kind, default, _text in OPTIONS:
        dest = flag[2:].replace("-", "_")
        given = getattr(args, dest)
        try:
            if given is not None:
                value = ([p for item in given for p in _list(item)] if flag == "--project"
                         else kind(given))
            elif environ.get(env, "").strip():
                value = kind(environ[env].strip())
            else:
                value = default
        except ValueError as exc:
            raise ValueError(f"{flag} / {env}: {exc}") from None
        values[dest] = value
    for flag, env, default, _text in BOOL_OPTIONS:
        dest = flag[2:].replace("-", "_")
        try:
            values[dest] = bool(getattr(args, dest)) or _bool(environ.get(env, str(default)))
        except ValueError as exc:
            raise ValueError(f"{flag} / {env}: {exc}") from None
    for required in ("master", "volume"):
        if not values[required]:
            raise ValueError(f"--{required} (or FLEETHQ_{required.upper()}) is required")
    if not values["project"]:
        raise ValueError("name at least one pdf project with --project (or FLEETHQ_PROJECTS)")
    if not 1 <= values["concurrency"] <= 64:
        raise ValueError("--concurrency must be 1..64")
    if not 1 <= values["browser_concurrency"] <= 16:
        raise ValueError("--browser-concurrency must be 1..16")
    if not 1.0 <= values["heartbeat_seconds"] <= 30.0:
        raise ValueError("--heartbeat-seconds must be 1..30 (the node lease is 60 s)")
    if values["task"] not in ("fetch", "ocr"):
        raise ValueError("--task must be fetch or ocr")
    if not 15 <= values["lease_seconds"] <= 3600:
        raise ValueError("--lease-seconds must be 15..3600")
    settings = Settings(
        master=values["master"], volume=values["volume"], projects=values["project"],
        enroll=values["enroll"], concurrency=values["concurrency"],
        browser_concurrency=values["browser_concurrency"], allow_http=values["allow_http"],
        heartbeat_s=values["heartbeat_seconds"], lease_s=values["lease_seconds"],
        spool_max_bytes=values["spool_max_bytes"], min_free_bytes=values["min_free_bytes"],
        retention_s=values["retention_hours"] * 3600, doi_resolver=values["doi_resolver"],
        arxiv_base=values["arxiv_base"], use_browser=not values["no_browser"],
        chromium_path=values["chromium"], fetch_timeout_s=values["fetch_timeout"],
        max_pdf_bytes=values["max_pdf_bytes"], allow_networks=values["allow_networks"],
        task=values["task"], ocr_languages=values["ocr_languages"])
    if settings.task == "ocr":
        settings.use_browser = False  # OCR reads its source from the master, never a publisher
    if values["client_version"]:
        settings.client_version = values["client_version"]
    if values["name"]:
        settings.name = values["name"][:128]
    return settings
