"""Find the PDF link on a publisher's landing page (stdlib html.parser only).

Order of preference, most reliable first:

1. ``<meta name="citation_pdf_url">`` (Highwire tags, read by Google Scholar,
   so nearly every publisher sets them), and the bepress/eprints variants;
2. ``<link rel="alternate" type="application/pdf">``;
3. ``<a href>`` whose path ends in ``.pdf``;
4. ``<a href>`` whose text, title or aria-label says PDF ("Download PDF");
5. ``<iframe>/<embed>/<object>`` sources (PDF viewer pages wrap the file).

The caller bounds the HTML it passes in; the parser also stops collecting
after :data:`MAX_CANDIDATES`.
"""
from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

MAX_HTML_BYTES = 2 * 1024 * 1024
MAX_CANDIDATES = 20
META_NAMES = frozenset({"citation_pdf_url", "bepress_citation_pdf_url", "eprints.document_url",
                        "wkhealth_pdf_url"})
_PDF_WORD = re.compile(r"\bpdf\b", re.I)


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.base = None
        self.ranked: list[tuple[int, str]] = []
        self._anchor: dict | None = None

    def _add(self, rank: int, url) -> None:
        if url and len(self.ranked) < MAX_CANDIDATES * 4:
            self.ranked.append((rank, url.strip()))

    def handle_starttag(self, tag, attrs):
        a = {k.lower(): (v or "") for k, v in attrs}
        if tag == "base" and self.base is None and a.get("href"):
            self.base = a["href"].strip()
        elif tag == "meta" and (a.get("name") or a.get("property", "")).lower() in META_NAMES:
            self._add(1, a.get("content"))
        elif tag == "link" and "alternate" in a.get("rel", "").lower() \
                and "pdf" in a.get("type", "").lower():
            self._add(2, a.get("href"))
        elif tag == "a":
            self.flush_anchor()       # an <a> left open by sloppy HTML ends at the next one
            if a.get("href"):
                self._anchor = {"href": a["href"], "text": a.get("title", "") + " " + a.get("aria-label", "")}
        elif tag in ("iframe", "embed", "object"):
            self._add(5, a.get("src") or a.get("data"))

    def handle_data(self, data):
        if self._anchor is not None and len(self._anchor["text"]) < 500:
            self._anchor["text"] += data

    def handle_endtag(self, tag):
        if tag == "a":
            self.flush_anchor()

    def flush_anchor(self):
        if self._anchor is None:
            return
        href, text = self._anchor["href"], self._anchor["text"]
        self._anchor = None
        path = urlsplit(href).path
        if path.lower().endswith(".pdf"):
            self._add(3, href)
        elif _PDF_WORD.search(text) or _PDF_WORD.search(path.replace("/", " ")):
            self._add(4, href)


def pdf_links(html: str, page_url: str, frames: bool = True) -> list[str]:
    """Absolute http(s) candidate PDF URLs found in ``html``, best first.

    ``frames=False`` leaves out iframe/embed/object sources (a browser loads
    those itself).
    """
    parser = _Collector()
    try:
        parser.feed(html)
        parser.close()
    except Exception:   # html.parser is lenient; anything odd just ends the scan
        pass
    parser.flush_anchor()
    base = urljoin(page_url, parser.base) if parser.base else page_url
    seen, out = set(), []
    for _rank, href in sorted(r for r in parser.ranked if frames or r[0] < 5):
        url = urljoin(base, href).split("#")[0]
        if urlsplit(url).scheme in ("http", "https") and url not in seen and url != page_url:
            seen.add(url)
            out.append(url)
    return out[:MAX_CANDIDATES]


def decode_html(body: bytes, headers) -> str:
    """Best-effort text of an HTML body (charset from the header, else UTF-8)."""
    ctype = headers.get("Content-Type") or ""
    match = re.search(r"charset=([\w.-]+)", ctype, re.I)
    try:
        return body.decode(match[1] if match else "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")
