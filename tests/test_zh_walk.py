"""Every page in Chinese speaks Chinese (issue "The first day of an
operator"): each page route of the app is walked under ``/zh`` with data on
it, and the test fails on English interface text — a phrase of three or
more English words outside the places that show data (codes, values,
error messages, state badges, worker ids, document text) — or a translated
fragment glued to an English ending ("6 篇论文s"). A page route this walk
does not know fails the test too, so a new page is walked from its first day."""
from __future__ import annotations

import io
import re
from html.parser import HTMLParser

import pytest

from tests import scans
from tests.fleet_helpers import Node
from tests.helpers import Api, body, sql
from tests.support.pages import Pages, sign_in

# What shows data, not interface: protocol names, values, errors as workers
# reported them, ids, document text. Marked in the templates by these.
DATA_TAGS = {"code", "pre", "script", "style", "kbd", "samp", "textarea", "option"}
DATA_CLASSES = {"badge", "worker-name", "wrap", "fold", "value", "data"}
ATTRS = ("title", "placeholder", "aria-label", "alt")
VOID = {"input", "br", "img", "meta", "link", "hr", "rect", "line", "polyline", "wbr"}
ENGLISH_PHRASE = re.compile(r"[A-Za-z][a-z]*(?: [a-z]+){2,}")
GLUED = re.compile(r"[\u4e00-\u9fff][A-Za-z]")

# GET routes that are not pages a person reads: files, OAuth hops, live
# fragments (their parts are walked inside their pages), machine answers.
NOT_PAGES = {"admin.job_file", "admin.held_file", "documents_pages.download", "auth.github_start",
             "auth.github_callback", "admin.dashboard_live", "admin.bulk_progress_live",
             "worker_pages.workers_fragment", "health.healthz", "health.readyz", "metrics", "static",
             "auth.root"}


ENGLISH_WORDS = re.compile(r"[A-Za-z][a-z]+(?: [a-z]+)*")


class Interface(HTMLParser):
    """The text a reader sees as interface: text and labelling attributes
    outside data elements; a button's label even when it is one word."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, bool]] = []
        self.texts: list[str] = []
        self.buttons: list[str] = []

    def _in_data(self) -> bool:
        return any(data for _, data in self.open)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        data = tag in DATA_TAGS or bool(classes & DATA_CLASSES)
        if tag not in VOID:
            self.open.append((tag if tag != "a" or "button" not in classes else "a-button", data))
        if not (data or self._in_data()):
            self.texts += [a[name] for name in ATTRS if a.get(name)]
            if tag == "input" and a.get("type") in ("submit", "button") and a.get("value"):
                self.texts.append(a["value"])

    def handle_endtag(self, tag):
        for i in range(len(self.open) - 1, -1, -1):
            if self.open[i][0] == tag or (tag == "a" and self.open[i][0] == "a-button"):
                del self.open[i:]
                return

    def handle_data(self, data):
        if data.strip() and not self._in_data():
            self.texts.append(" ".join(data.split()))
            if any(tag in ("button", "a-button") for tag, _ in self.open):
                self.buttons.append(" ".join(data.split()))


def english_in(html: str) -> list[str]:
    parser = Interface()
    parser.feed(html)
    return [t for t in parser.texts if ENGLISH_PHRASE.search(t) or GLUED.search(t)] + [
        b for b in parser.buttons if ENGLISH_WORDS.fullmatch(b)]


@pytest.fixture
def fleet(app, client, admin_token, dirs, tmp_path):
    """A master with something on every page: projects of each kind, jobs in
    each state with errors, a node and a token worker, a hook and its
    delivery, a site rule and pause, a document, audit entries, a bulk action."""
    api = Api(client, admin_token)
    api.put_project("crawl", max_resets=0)
    api.enqueue("crawl", [{"id": f"c{i}", "value": f"https://example.org/c/{i}"} for i in range(6)])
    claimed = body(api.claim("crawl", max_jobs=3, worker_id="zh-walk-laptop"))["jobs"]
    body(api.complete("crawl", claimed[:1], worker_id="zh-walk-laptop"))
    body(api.fail("crawl", claimed[1:2], retryable=False, worker_id="zh-walk-laptop", code="http_404"))
    api.put_project("papers", kind="pdf", identity_mode="unique_value")
    api.enqueue("papers", [{"value": "10.1234/walk.1"}])
    node = Node(client, app, name="lab-3")
    assert node.heartbeat().status_code == 200
    api.put_project("letters", kind="documents")
    consumer = sql(app, "INSERT INTO hook_consumers (project_id, name, url, secret) VALUES "
                        "('papers', 'ocr', 'https://ocr.example.org/h', 'sssssssssssssssssss') RETURNING id")[0][0]
    sql(app, "INSERT INTO hook_deliveries (consumer_id, project_id, attempt_id, asset_key, state, tries, "
             "last_error) VALUES (:c, 'papers', 1, 'doi/x.pdf', 'failed', 3, 'HTTP 500: boom')", c=consumer)
    assert api.call("PUT", "/api/v1/fleethq/sites/example.org/limit",
                    {"max_in_flight": 2}).status_code == 200
    sign_in(app, client)
    pages = Pages(client, "page-admin")
    scan = scans.scanned_pdf(tmp_path / "s.pdf", [["quartz harbour lantern"]]).read_bytes()
    pages.act("/admin/projects/letters/documents", {"files": [(io.BytesIO(scan), "scan.pdf")]},
              content_type="multipart/form-data")
    assert pages.post("/admin/projects/crawl/jobs/bulk-start",
                      {"action": "requeue", "state": "failed", "confirm": "yes"}).status_code == 303
    action_id = sql(app, "SELECT max(id) FROM bulk_actions")[0][0]
    job_id = sql(app, "SELECT min(id) FROM jobs WHERE project_id = 'crawl'")[0][0]
    document_id = sql(app, "SELECT min(id) FROM documents")[0][0]
    return {
        "admin.dashboard": ["/admin"], "admin.audit_log": ["/admin/audit"], "admin.hooks": ["/admin/hooks"],
        "admin.projects": ["/admin/projects"],
        "admin.project": ["/admin/projects/crawl", "/admin/projects/papers", "/admin/projects/letters"],
        "admin.job": [f"/admin/jobs/{job_id}"],
        "admin.job_search_page": ["/admin/projects/crawl/jobs/search",
                                  "/admin/projects/crawl/jobs/search?error_code=http_404&count=1"],
        "admin.bulk_confirm": ["/admin/projects/crawl/jobs/bulk-confirm?action=delete&state=todo"],
        "admin.bulk_progress": [f"/admin/projects/crawl/bulk/{action_id}"],
        "admin.search": ["/admin/search", "/admin/search?q=harbour"],
        "admin.sites": ["/admin/sites"], "admin.users": ["/admin/users"], "admin.workers": ["/admin/workers"],
        "admin.node": [f"/admin/workers/node/{node.node_id}"],
        "admin.token_worker": ["/admin/workers/token/admin/zh-walk-laptop"],
        "documents_pages.index": ["/documents"], "documents_pages.show": [f"/documents/{document_id}"],
        "progress_pages.index": ["/progress"], "worker_pages.index": ["/worker"], "auth.login": ["/login"],
    }


def test_every_page_in_chinese_has_no_english_interface_text(app, client, fleet):
    routes = {r.endpoint for r in app.url_map.iter_rules() if "GET" in r.methods
              and not r.rule.startswith("/api/")}
    unwalked = sorted(routes - set(fleet) - NOT_PAGES)
    assert not unwalked, f"page routes this walk does not visit (add them to it): {unwalked}"
    found = {}
    signed_out = app.test_client()  # the sign-in page, as one who is not
    for endpoint, urls in fleet.items():
        for url in urls:
            answer = (signed_out if endpoint == "auth.login" else client).get("/zh" + url)
            assert answer.status_code == 200, (url, answer.status_code)
            english = english_in(answer.get_data(as_text=True))
            if english:
                found[url] = english
    assert not found, "English on Chinese pages:\n" + "\n".join(
        f"{url}: {texts}" for url, texts in found.items())


def test_the_walk_catches_english_and_glued_fragments():
    assert english_in("<p>任务 <b>waiting for a worker</b></p>") == ["waiting for a worker"]
    assert english_in('<p title="the lease workers ask for">租约</p>') == ["the lease workers ask for"]
    assert english_in("<p>6 篇论文s</p>") == ["6 篇论文s"]
    assert english_in('<button>revoke</button><a class="button" href="#">drain</a>') == ["revoke", "drain"]
    assert english_in('<td class="wrap">not found at mirror 4</td><code>a b c d</code>') == []
