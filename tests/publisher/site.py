"""The publisher's pages: one route per way real publishers hand out (or refuse) a PDF.

A plain WSGI app on werkzeug. ``<n>`` is the paper number: paper n is the
PDF ``make_pdf(seed=n)``, so every route that ends in a PDF serves the same
bytes for the same n and tests can compare SHA-256s.
"""
from __future__ import annotations

import base64
import html
import json
import re
import time

from werkzeug.utils import send_file
from werkzeug.wrappers import Request, Response

CHALLENGE_TEXT = ("<title>Just a moment...</title><h1>Checking your browser before accessing"
                  " the journal</h1><p>Please verify you are human.</p><div class=cf-challenge"
                  " id=captcha-box></div>")
PAYWALL_TEXT = ("<h1>Access options</h1><p>Subscribe to the journal or purchase this article"
                " to read the full text.</p><p><a href=/login>Log in to your account</a></p>")


def arxiv_seed(ident: str) -> int:
    """The paper number behind an arXiv id (any version): a stable hash."""
    ident = re.sub(r"v\d+$", "", ident.removesuffix(".pdf"))
    return 1_000_000 + sum(ord(c) * 31 ** i for i, c in enumerate(ident)) % 1_000_000


def page(body: str, status: int = 200, title: str = "Article", head: str = "") -> Response:
    doc = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
           f"{head}</head><body><header><a href=/login>Sign in</a></header>{body}</body></html>")
    return Response(doc, status=status, mimetype="text/html")


class Site:
    def __init__(self, publisher, label: str):
        self.pub, self.label = publisher, label

    # --- plumbing ---------------------------------------------------------

    def __call__(self, environ, start_response):
        environ["fleethq.server"] = self.label
        request = Request(environ)
        record = self.pub._record(request)
        parts = [p for p in request.path.split("/") if p]
        handler = getattr(self, "r_" + parts[0].replace("-", "_"), None) if parts else None
        try:
            response = handler(request, *parts[1:]) if handler else page("no such page", 404)
        except (TypeError, ValueError, KeyError):
            response = page("bad request", 400)
        record["done"] = time.time()
        return response(environ, start_response)

    def pdf(self, request, n, *, attachment=False, mimetype="application/pdf") -> Response:
        path = self.pub.paper_path(int(str(n).removesuffix(".pdf")))
        return send_file(path, request.environ, mimetype=mimetype, as_attachment=attachment,
                         download_name=f"paper-{n}.pdf" if attachment else None, conditional=False)

    def redirect(self, url: str, status: int = 302) -> Response:
        return Response("", status=status, headers={"Location": url})

    # --- papers served the usual ways -------------------------------------

    def r_papers(self, request, n):                     # direct PDF
        return self.pdf(request, n)

    r_viewer = r_download = r_papers                    # inline PDFs reached from pages

    def r_scans(self, request, n):                      # an image-only PDF, for OCR
        path = self.pub.scan_path(int(str(n).removesuffix(".pdf")))
        return Response(path.read_bytes(), mimetype="application/pdf")

    def r_attachment(self, request, n):                 # Content-Disposition: attachment
        return self.pdf(request, n, attachment=True, mimetype="application/octet-stream")

    def r_landing(self, request, n):                    # Highwire citation_pdf_url
        meta = f'<meta name="citation_pdf_url" content="{self.pub.url}/papers/{n}.pdf">'
        return page(f"<h1>Paper {n}</h1><p>Abstract.</p>", head=meta)

    def r_links(self, request, n):                      # only a "Download PDF" link
        return page(f'<h1>Paper {n}</h1><a class=btn href="/download/{n}">Download PDF</a>')

    def r_chain(self, request, k, n):                   # exactly k redirects, then the PDF
        k = int(k)
        if k == 0:
            return self.pdf(request, n)
        return self.redirect(f"/chain/{k - 1}/{n}", (301, 302, 303, 307, 308)[k % 5])

    def r_cookie(self, request, n):                     # PDF link works only with the session cookie
        response = page(f'<a href="/members/{n}.pdf">PDF</a>')
        response.set_cookie("session", "granted", path="/")
        return response

    def r_members(self, request, n):
        if request.cookies.get("session") != "granted":
            return page(PAYWALL_TEXT, 403)
        return self.pdf(request, n)

    # --- pages only a browser gets through ---------------------------------

    def _script(self, js: str, text: str = "Loading the article…") -> Response:
        return page(f"<p id=msg>{text}</p><script>{js}</script>")

    def r_jslink(self, request, n):                     # link inserted by JS after a delay
        return self._script("setTimeout(function () { var a = document.createElement('a');"
                            f" a.href = '/viewer/' + {int(n)}; a.textContent = 'Full text (PDF)';"
                            " document.body.appendChild(a); }, 300);")

    def r_jsredirect(self, request, n):                 # JS navigates to an inline PDF
        return self._script(f"setTimeout(function () {{ location.href = '/viewer/{int(n)}'; }}, 100);")

    def r_jsattach(self, request, n):                   # JS navigates to an attachment
        return self._script(f"location.href = '/attachment/{int(n)}';")

    def r_js(self, request, *rest):                     # JS navigates to /<rest>?<query>
        target = "/" + "/".join(rest) + (f"?{request.query_string.decode()}" if request.query_string else "")
        return self._script(f"setTimeout(function () {{ location.href = {json.dumps(target)}; }}, 50);")

    def r_blob(self, request, n):                       # PDF built in the page, saved as a download
        data = base64.b64encode(self.pub.paper_path(int(n)).read_bytes()).decode()
        return self._script(
            f"var b = Uint8Array.from(atob('{data}'), function (c) {{ return c.charCodeAt(0); }});"
            " var a = document.createElement('a');"
            " a.href = URL.createObjectURL(new Blob([b], {type: 'application/pdf'}));"
            f" a.download = 'paper-{int(n)}.pdf'; document.body.appendChild(a); a.click();")

    def r_jschallenge(self, request, n):                # bot check passed by running its JS
        if request.cookies.get("clearance") == "ok":
            return self.pdf(request, n)
        js = "document.cookie = 'clearance=ok; path=/'; setTimeout(function () { location.reload(); }, 300);"
        return page(CHALLENGE_TEXT + f"<script>{js}</script>", 503, "Just a moment...")

    # --- refusals and failures ---------------------------------------------

    def r_nolink(self, request, n):                     # an abstract page and nothing else
        return page(f"<h1>Paper {n}</h1><p>Abstract only.</p>")

    def r_paywall(self, request, n):
        return page(PAYWALL_TEXT)

    def r_paywall403(self, request, n):
        return page(PAYWALL_TEXT, 403)

    def r_locked(self, request, n):                     # landing whose PDF link needs a login
        if str(n).endswith(".pdf"):
            return page("<p>Sign in to download this PDF.</p>", 401)
        return page("<p>Abstract.</p>", head=f'<meta name="citation_pdf_url" content="/locked/{n}.pdf">')

    def r_challenge(self, request, n):
        return page(CHALLENGE_TEXT, 503, "Just a moment...")

    def r_captcha(self, request, n):
        return page(CHALLENGE_TEXT, 403, "Attention Required")

    def r_throttled(self, request, n):                  # 429, Retry-After: `after` (empty: none)
        response = page("<h1>Too many requests</h1>", 429, "Too Many Requests")
        if request.args.get("after", "120"):
            response.headers["Retry-After"] = request.args.get("after", "120")
        return response

    def r_busy(self, request, n):                       # 503 without a bot check
        return page("<h1>Service unavailable</h1><p>Try again later.</p>", 503, "Service Unavailable")

    def r_missing(self, request, n):
        return page("<h1>Not found</h1>", 404)

    def r_gone(self, request, n):
        return page("<h1>Withdrawn</h1>", 410)

    def r_fakepdf(self, request, n):                    # HTML served as application/pdf
        return Response(self.pub.fake_pdf_path().read_bytes(), mimetype="application/pdf")

    def r_truncated(self, request, n):
        return Response(self.pub.truncated_path(int(n)).read_bytes(), mimetype="application/pdf")

    def r_slow(self, request, n):                       # nothing for `delay` seconds
        time.sleep(float(request.args.get("delay", "5")))
        return self.pdf(request, n)

    def r_drip(self, request, n):                       # headers at once, then 1 KiB per interval
        data, interval = self.pub.paper_path(int(n)).read_bytes(), float(request.args.get("interval", "0.5"))

        def body():
            for i in range(0, len(data), 1024):
                yield data[i:i + 1024]
                time.sleep(interval)
        return Response(body(), mimetype="application/pdf")

    def r_huge(self, request, n):                       # a "PDF" of `bytes` bytes, streamed
        size, declared = int(request.args.get("bytes", str(200 << 20))), request.args.get("declared")

        def body():
            yield b"%PDF-1.7\n"
            for _ in range(0, size, 1 << 16):
                yield b"\0" * (1 << 16)
        headers = {"Content-Length": str(-(-size // (1 << 16)) * (1 << 16) + 9)} if declared else {}
        return Response(body(), mimetype="application/pdf", headers=headers)

    def r_to(self, request):                            # redirect anywhere (SSRF tests)
        return self.redirect(request.args["url"])

    def r_ssrf(self, request, what):
        targets = self.pub.ssrf_targets()
        if what.startswith("landing-"):                 # a citation_pdf_url into a forbidden place
            return page("<p>Abstract.</p>", head=f'<meta name="citation_pdf_url" content="{targets[what[8:]]}">')
        if what.startswith("embed-"):                   # subresources there, the PDF elsewhere
            bad = html.escape(targets[what[6:]], quote=True)
            return page(f'<script src="{bad}"></script><iframe src="{bad}"></iframe>'
                        f'<script>fetch("{bad}").catch(function () {{}});'
                        f' setTimeout(function () {{ location.href = "/viewer/9"; }}, 200);</script>')
        if what.startswith("js-"):                      # a page whose JS goes there
            return self._script(f"location.href = {json.dumps(targets[what[3:]])};")
        return self.redirect(targets[what])

    # --- DOI resolver and arXiv --------------------------------------------

    def r_doi(self, request, *doi):                     # 10.5555/<route...> → /<route...>
        if len(doi) < 2 or doi[0] != "10.5555":
            return page("DOI not found", 404)
        return self.redirect(f"{self.pub.url}/{'/'.join(doi[1:])}")

    def r_arxiv(self, request, kind, *ident):
        if kind == "pdf":
            return self.pdf(request, arxiv_seed("/".join(ident)))
        return page(f'<a href="/arxiv/pdf/{"/".join(ident)}">PDF</a>')
