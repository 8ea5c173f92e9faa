"""``Publisher``: the local site served over real HTTP(S) in threads.

The main server listens on 127.0.0.2 (any address of 127/8 works on Linux),
so a fetch config can allow exactly that address (:attr:`allow_addresses`)
while 127.0.0.1 stays forbidden. A second "decoy" server on 127.0.0.1 serves
the same pages: SSRF tests redirect to it and then check it was never hit,
which proves a refusal happened before any connection.

No pytest here: the demo and the benchmarks use it too::

    with Publisher() as pub:
        cfg = pub.fetch_config()
        for paper in pub.papers(50):
            fetch_document(paper.value, "/tmp/out", cfg)
"""
from __future__ import annotations

import hashlib
import ipaddress
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from werkzeug.serving import WSGIRequestHandler, make_server

from tests.pdfs import html_as_pdf, make_pdf, truncated_pdf

from .site import Site, arxiv_seed

KIND_PATHS = {
    # reachable over plain HTTP (strategy direct or landing)
    "direct": "/papers/{n}.pdf", "landing": "/landing/{n}", "links": "/links/{n}",
    "attachment": "/attachment/{n}", "chain": "/chain/3/{n}", "cookie": "/cookie/{n}",
    # need the browser lane
    "jslink": "/jslink/{n}", "jsredirect": "/jsredirect/{n}", "jsattach": "/jsattach/{n}",
    "blob": "/blob/{n}", "jschallenge": "/jschallenge/{n}",
}
HTTP_KINDS = ("direct", "landing", "links", "attachment", "chain")
SCAN_WORDS = ("harbour", "lantern", "meadow", "violin", "falcon", "granite", "orchid", "sailor")
BROWSER_KINDS = ("jslink", "jsredirect", "jsattach", "blob", "jschallenge")


@dataclass(frozen=True)
class Paper:
    value: str        # what to give fetch_document
    kind: str
    number: int
    sha256: str       # of the PDF it should end in
    size: int
    lane: str         # 'http' or 'browser'


class _QuietHandler(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"     # keep-alive, chunked streaming: like real servers

    def log(self, *args, **kwargs):   # no access log on the test output
        pass


class Publisher:
    def __init__(self, host: str = "127.0.0.2", *, paper_bytes: int = 64 * 1024,
                 tls_hostname: str | None = None, workdir: str | None = None):
        self.host, self.paper_bytes, self.tls_hostname = host, paper_bytes, tls_hostname
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="fleethq-publisher-")
        self.dir = Path(workdir or self._tmp.name)
        self.requests: list[dict] = []          # every request either server received
        self.sni: list[str] = []                # TLS server names clients sent
        self._lock = threading.Lock()
        self._sha: dict[int, str] = {}
        self._servers: list = []
        self.ca_file: str | None = None

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> "Publisher":
        ssl_context = None
        if self.tls_hostname:
            from .tls import make_certificates
            self.ca_file, cert, key = make_certificates(self.dir, self.tls_hostname)
            ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ssl_context.load_cert_chain(cert, key)
            ssl_context.sni_callback = lambda sock, name, ctx: self.sni.append(name)
        main = make_server(self.host, 0, Site(self, "main"), threaded=True,
                           request_handler=_QuietHandler, ssl_context=ssl_context)
        decoy = make_server("127.0.0.1", 0, Site(self, "decoy"), threaded=True,
                            request_handler=_QuietHandler)
        for server in (main, decoy):
            threading.Thread(target=server.serve_forever, name="publisher", daemon=True).start()
            self._servers.append(server)
        self.port, self.decoy_port = main.server_port, decoy.server_port
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- addresses ------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.tls_hostname:
            return f"https://{self.tls_hostname}:{self.port}"
        return f"http://{self.host}:{self.port}"

    @property
    def decoy_url(self) -> str:
        return f"http://127.0.0.1:{self.decoy_port}"

    @property
    def allow_addresses(self) -> list:
        """The allow-list for FetchConfig: this server's address and nothing else."""
        return [ipaddress.ip_network(f"{self.host}/32")]

    def ssrf_targets(self) -> dict[str, str]:
        """Forbidden places, each of which would serve a PDF (or metadata) if reached."""
        return {
            "loopback": f"{self.decoy_url}/papers/1.pdf",
            "localhost": f"http://localhost:{self.decoy_port}/papers/1.pdf",
            "mapped": f"http://[::ffff:127.0.0.1]:{self.decoy_port}/papers/1.pdf",
            "private": "http://10.255.255.1/papers/1.pdf",
            "linklocal": "http://169.254.1.1/papers/1.pdf",
            "metadata": "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
            "cgnat": "http://100.64.0.1/papers/1.pdf",
        }

    def decoy_hits(self) -> list[dict]:
        return [r for r in self.requests if r["server"] == "decoy"]

    def fetch_config(self, **overrides):
        """A FetchConfig pointed at this publisher (resolver, arXiv, allow-list, CA)."""
        from workers.fetch import FetchConfig
        fields = dict(doi_resolver=f"{self.url}/doi/", arxiv_base=f"{self.url}/arxiv/",
                      allow_addresses=self.allow_addresses, ca_bundle=self.ca_file)
        return FetchConfig(**{**fields, **overrides})

    # --- content --------------------------------------------------------------

    def _record(self, request) -> dict:
        """Record a request as it arrives; the site adds ``done`` (when its
        answer was ready) so tests can tell which requests overlapped."""
        record = {"server": request.environ.get("fleethq.server"), "method": request.method,
                  "path": request.full_path.rstrip("?"), "host": request.host,
                  "user_agent": request.user_agent.string,
                  "cookie": request.headers.get("Cookie"),
                  "authorization": request.headers.get("Authorization"),
                  "at": time.time()}
        self.requests.append(record)
        return record

    def paper_path(self, n: int) -> Path:
        path = self.dir / f"paper-{n}.pdf"
        with self._lock:
            if n not in self._sha:
                self._sha[n] = make_pdf(path, pages=2, target_bytes=self.paper_bytes, seed=n)
        return path

    def sha256(self, n: int) -> str:
        self.paper_path(n)
        return self._sha[n]

    def scan_path(self, n: int) -> Path:
        """A one-page scan (words as an image, no text layer) for OCR runs:
        its first line reads ``scan <n> <word>``."""
        path = self.dir / f"scan-{n}.pdf"
        with self._lock:
            if not path.exists():
                from tests.scans import scanned_pdf
                word = SCAN_WORDS[n % len(SCAN_WORDS)]
                scanned_pdf(path, [[f"scan {n} {word}", "a page scanned for the run",
                                    "every word of it is found by its text"]])
        return path

    def arxiv_sha256(self, ident: str) -> str:
        return self.sha256(arxiv_seed(ident))

    def fake_pdf_path(self) -> Path:
        path = self.dir / "fake.pdf"
        with self._lock:
            if not path.exists():
                html_as_pdf(path)
        return path

    def truncated_path(self, n: int) -> Path:
        path = self.dir / f"truncated-{n}.pdf"
        source = self.paper_path(n)
        with self._lock:
            if not path.exists():
                truncated_pdf(source, path, fraction=0.5, forge_eof=True)
        return path

    def papers(self, count: int, kinds=HTTP_KINDS, start: int = 1) -> list[Paper]:
        """``count`` papers cycling through ``kinds`` (see KIND_PATHS), numbered from ``start``."""
        out = []
        for i in range(count):
            n, kind = start + i, kinds[i % len(kinds)]
            sha = self.sha256(n)
            out.append(Paper(self.url + KIND_PATHS[kind].format(n=n), kind, n, sha,
                             self.paper_path(n).stat().st_size,
                             "browser" if kind in BROWSER_KINDS else "http"))
        return out


def file_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
