"""A local publisher site for fetch tests, the demo and the benchmarks (see server.py)."""
from .server import BROWSER_KINDS, HTTP_KINDS, KIND_PATHS, Paper, Publisher, file_sha256

__all__ = ["Publisher", "Paper", "HTTP_KINDS", "BROWSER_KINDS", "KIND_PATHS", "file_sha256"]
