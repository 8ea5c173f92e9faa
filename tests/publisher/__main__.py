"""Serve the publisher from the command line (or as a test's child process).

    python -m tests.publisher [--host 127.0.0.2] [--paper-bytes N] [--papers N] [--kinds http|browser|all]

Prints one JSON line — url, decoy_url, host, allow_addresses and the papers
(value, kind, sha256, size, lane) — then serves until stdin closes or Ctrl-C.
A separate process keeps the server's own work out of the measurements of
the fetching process (memory, CPU).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from .server import BROWSER_KINDS, HTTP_KINDS, Publisher


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.publisher")
    parser.add_argument("--host", default="127.0.0.2")
    parser.add_argument("--paper-bytes", type=int, default=64 * 1024)
    parser.add_argument("--papers", type=int, default=0)
    parser.add_argument("--kinds", choices=("http", "browser", "all"), default="http")
    args = parser.parse_args(argv)
    kinds = {"http": HTTP_KINDS, "browser": BROWSER_KINDS, "all": HTTP_KINDS + BROWSER_KINDS}[args.kinds]
    with Publisher(args.host, paper_bytes=args.paper_bytes) as pub:
        info = {"url": pub.url, "decoy_url": pub.decoy_url, "host": pub.host,
                "allow_addresses": [str(n) for n in pub.allow_addresses],
                "papers": [asdict(p) for p in pub.papers(args.papers, kinds)] if args.papers else []}
        print(json.dumps(info), flush=True)
        try:
            sys.stdin.read()          # until the parent closes our stdin
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
