"""Full-text search of archived papers (``app.search``) on real PostgreSQL:
indexing per page in the caller's transaction, re-indexing, the limits, the
query syntax and its refusals, ranking, snippets that highlight the matched
words and never carry markup from the paper, the project filter, the
candidate cap, the admin page and the JSON route."""
from __future__ import annotations

import html
import re

import pytest

from app.errors import InvalidRequest, NotFound, TooLarge
from app.extensions import db
from app.search import index, query
from tests.helpers import Api, api_error, body, sql
from tests.support.pages import sign_in

INTRO = "Introduction to the archive of FleetHQ papers"
METHODS = "We describe the method: crawling Łódź libraries and scanning microfilm"
RESULTS = "Results show that microfilm scans of Łódź are legible"


def asset(app, key: str, project: str = "p1", job_id: int | None = None) -> None:
    sql(app, "INSERT INTO assets (canonical_key, sha256, size, object_key, project_id, job_id) "
             "VALUES (:k, :s, 1, :o, :p, :j)", k=key, s="0" * 64, o=f"sha256/{key}", p=project,
        j=job_id)


def indexed(app, key: str, text: str, project: str = "p1", **kw) -> int:
    """Index ``text`` for a new or existing asset and commit, as the archive step does."""
    if not sql(app, "SELECT 1 FROM assets WHERE canonical_key = :k", k=key):
        asset(app, key, project)
    with app.app_context():
        pages = index.index_paper(key, project, text, **kw)
        db.session.commit()
        db.session.remove()
    return pages


def find(app, q: str, **kw) -> dict:
    with app.app_context():
        try:
            return query.search(q, **kw)
        finally:
            db.session.remove()


def marked(result: dict) -> list[str]:
    return [s["text"] for s in result["snippet"] if s["match"]]


def plain(result: dict) -> str:
    return "".join(s["text"] for s in result["snippet"])


# ------------------------------------------------------------------ indexing


def test_index_finds_words_on_their_page_with_a_highlighted_snippet(app):
    assert indexed(app, "doi:10.1/a", f"{INTRO}\f{METHODS}\f{RESULTS}\f",
                   derived_key="ocr:doi:10.1/a", languages="eng+pol") == 3
    assert sql(app, "SELECT project_id, derived_key, pages, chars, languages FROM paper_texts") == [
        ("p1", "ocr:doi:10.1/a", 3, len(INTRO + METHODS + RESULTS) + 3, "eng+pol")]
    assert sql(app, "SELECT page FROM paper_pages ORDER BY page") == [(1,), (2,), (3,)]

    found = find(app, "crawling")
    assert (found["total"], found["more"], found["total_is_lower_bound"]) == (1, False, False)
    [hit] = found["results"]
    assert (hit["canonical_key"], hit["project_id"], hit["page"], hit["pages_matched"]) == \
        ("doi:10.1/a", "p1", 2, 1)
    assert marked(hit) == ["crawling"]
    assert "describe the method: crawling Łódź libraries" in plain(hit)

    # Case and accents aside; a word on two pages counts both for its paper.
    hit = find(app, "LODZ")["results"][0]
    assert hit["pages_matched"] == 2 and marked(hit) == ["Łódź"]
    assert find(app, "microfilm")["results"][0]["page"] in (2, 3)


def test_query_syntax_phrase_or_and_exclusion(app):
    indexed(app, "doi:10.1/a", METHODS)
    indexed(app, "doi:10.1/b", RESULTS)
    keys = lambda q: sorted(r["canonical_key"] for r in find(app, q)["results"])  # noqa: E731
    assert keys('"microfilm scans"') == ["doi:10.1/b"]
    assert keys('"scans microfilm"') == []
    assert keys("crawling or legible") == ["doi:10.1/a", "doi:10.1/b"]
    assert keys("microfilm -crawling") == ["doi:10.1/b"]
    assert keys("microfilm crawling") == ["doi:10.1/a"]
    assert keys("unicorn") == []


def test_more_matches_rank_higher_and_results_page(app):
    indexed(app, "doi:10.1/once", "a paper that mentions tokamak once among many other words here")
    indexed(app, "doi:10.1/often", "tokamak tokamak tokamak: the tokamak design of a tokamak")
    found = find(app, "tokamak")
    assert [r["canonical_key"] for r in found["results"]] == ["doi:10.1/often", "doi:10.1/once"]
    assert found["results"][0]["rank"] > found["results"][1]["rank"]
    first = find(app, "tokamak", limit=1)
    assert (first["total"], first["more"], len(first["results"])) == (2, True, 1)
    second = find(app, "tokamak", limit=1, offset=1)
    assert [r["canonical_key"] for r in second["results"]] == ["doi:10.1/once"]
    assert second["more"] is False
    beyond = find(app, "tokamak", offset=5)  # past the end: still the count
    assert (beyond["results"], beyond["total"], beyond["more"]) == ([], 2, False)


def test_snippets_escape_paper_text_and_cannot_fake_highlights(app, client):
    hostile = ('Attack 5 < 6 && x > 2 "quoted" \ue000fake\ue001 <script>alert(1)</script> '
               'payload <img src=x onerror=alert(2)> here')
    indexed(app, "doi:10.1/<b>evil</b>", hostile)
    [hit] = find(app, "payload")["results"]
    assert marked(hit) == ["payload"]  # the private-use markers in the text were dropped
    assert "fake" in plain(hit) and "\ue000" not in plain(hit)

    sign_in(app, client)
    page = client.get("/admin/search?q=payload").get_data(as_text=True)
    assert "<mark>payload</mark>" in page
    assert "<script>alert" not in page and "<img" not in page and "<b>evil" not in page
    assert "5 &lt; 6 &amp;&amp; x &gt; 2" in page
    assert "doi:10.1/&lt;b&gt;evil&lt;/b&gt;" in page


def test_project_filter(app):
    indexed(app, "doi:10.1/a", METHODS, project="p1")
    indexed(app, "doi:10.1/b", RESULTS, project="p2")
    assert [r["canonical_key"] for r in find(app, "microfilm", project_id="p2")["results"]] == \
        ["doi:10.1/b"]
    assert find(app, "crawling", project_id="p2")["results"] == []
    assert find(app, "microfilm")["total"] == 2


def test_reindexing_replaces_the_text(app):
    indexed(app, "doi:10.1/a", f"{INTRO}\f{METHODS}\f{RESULTS}", languages="eng")
    assert indexed(app, "doi:10.1/a", "Second edition\fwith corrigenda", languages="pol") == 2
    assert find(app, "crawling")["results"] == []
    assert find(app, "corrigenda")["results"][0]["page"] == 2
    assert sql(app, "SELECT pages, languages FROM paper_texts") == [(2, "pol")]
    assert sql(app, "SELECT count(*) FROM paper_pages") == [(2,)]


def test_index_runs_in_the_callers_transaction(app):
    asset(app, "doi:10.1/a")
    with app.app_context():
        index.index_paper("doi:10.1/a", "p1", METHODS)
        assert query.search("crawling")["total"] == 1  # visible inside the transaction
        db.session.rollback()
        db.session.remove()
    assert find(app, "crawling")["total"] == 0
    assert sql(app, "SELECT count(*) FROM paper_texts") == [(0,)]


def test_empty_pages_keep_the_numbering_and_deleting_the_asset_forgets_the_text(app):
    assert indexed(app, "doi:10.1/a", "\f\fthird page only\f") == 3
    assert find(app, "third")["results"][0]["page"] == 3
    sql(app, "DELETE FROM assets WHERE canonical_key = 'doi:10.1/a'")
    assert sql(app, "SELECT (SELECT count(*) FROM paper_texts), (SELECT count(*) FROM paper_pages)") \
        == [(0, 0)]


def test_limits_and_bad_papers_are_refused_with_clear_errors(app):
    asset(app, "doi:10.1/a")
    with app.app_context():
        with pytest.raises(TooLarge, match=f"more than {index.MAX_PAGES} pages") as exc:
            index.index_paper("doi:10.1/a", "p1", "\f" * index.MAX_PAGES + "x")
        assert exc.value.details["limit"] == index.MAX_PAGES
        # Exactly the limit is fine (the trailing form feed ends the last page).
        assert index.index_paper("doi:10.1/a", "p1", "\f" * index.MAX_PAGES) == index.MAX_PAGES
        db.session.rollback()

        big = "ż" * (index.MAX_PAGE_BYTES // 2 + 1)  # fewer characters than bytes
        with pytest.raises(TooLarge, match=f"page 2 of doi:10.1/a exceeds {index.MAX_PAGE_BYTES} bytes") as exc:
            index.index_paper("doi:10.1/a", "p1", f"fine\f{big}")
        assert exc.value.details["page"] == 2
        assert index.index_paper("doi:10.1/a", "p1", "ż" * (index.MAX_PAGE_BYTES // 2)) == 1
        db.session.rollback()

        with pytest.raises(InvalidRequest, match="NUL"):
            index.index_paper("doi:10.1/a", "p1", "a\x00b")
        with pytest.raises(NotFound, match="no asset doi:10.1/missing"):
            index.index_paper("doi:10.1/missing", "p1", "text")
        with pytest.raises(InvalidRequest, match="belongs to project p1, not p2"):
            index.index_paper("doi:10.1/a", "p2", "text")
        with pytest.raises(InvalidRequest, match="languages"):
            index.index_paper("doi:10.1/a", "p1", "text", languages="x" * 300)
        db.session.remove()
    assert sql(app, "SELECT count(*) FROM paper_texts") == [(0,)]


def test_bad_queries_are_refused_with_clear_messages(app):
    indexed(app, "doi:10.1/a", METHODS)
    for q, message in (("", "q is empty"), ("   ", "q is empty"),
                       ("x" * (query.MAX_QUERY_CHARS + 1), "longer than 256 characters"),
                       ("!!! ... ???", "no searchable word"), ("-crawling", "a -word only excludes"),
                       ("a\x00b", "NUL")):
        with pytest.raises(InvalidRequest, match=message):
            find(app, q)
    assert find(app, " crawling ")["query"] == "crawling"
    with pytest.raises(InvalidRequest, match="limit must be an integer from 1 to 100"):
        find(app, "crawling", limit=0)
    with pytest.raises(InvalidRequest, match="offset must be an integer from 0 to 1000"):
        find(app, "crawling", offset=-1)


def test_a_word_on_more_pages_than_are_ranked_says_so(app):
    pages = query.CANDIDATE_PAGES + 5
    indexed(app, "doi:10.1/big", "\f".join(f"common word page{n}" for n in range(pages)))
    indexed(app, "doi:10.1/small", "one rare word")
    found = find(app, "common")
    assert found["total_is_lower_bound"] is True
    assert found["results"][0]["pages_matched"] > query.CANDIDATE_PAGES - 1
    assert find(app, "rare")["total_is_lower_bound"] is False


# ------------------------------------------------------------------ page and API


def test_admin_page_lists_results_with_page_project_and_job_link(app, client, admin_token):
    api = Api(client, admin_token)
    api.put_project("p1", kind="pdf", identity_mode="unique_value")
    api.enqueue("p1", [{"value": "https://example.org/a.pdf"}])
    [(job_id,)] = sql(app, "SELECT id FROM jobs WHERE project_id = 'p1'")
    asset(app, "doi:10.1/a", "p1", job_id=job_id)
    indexed(app, "doi:10.1/a", f"{INTRO}\f{METHODS}")
    sign_in(app, client)

    empty = client.get("/admin/search")
    assert empty.status_code == 200
    assert 'href="/admin/search"' in empty.get_data(as_text=True)  # in the navigation

    response = client.get("/admin/search?q=crawling&project=p1")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "1 paper" in page and "page 2" in page and "· p1" in page
    assert f'<a href="/admin/jobs/{job_id}">doi:10.1/a</a>' in page
    assert "<mark>crawling</mark>" in page

    assert "No paper matches" in client.get("/admin/search?q=unicorn").get_data(as_text=True)
    refused = client.get("/admin/search?q=-crawling")
    assert refused.status_code == 400
    assert "a -word only excludes pages" in html.unescape(refused.get_data(as_text=True))
    unknown = client.get("/admin/search?q=crawling&project=nope")
    assert unknown.status_code == 400 and "unknown project" in unknown.get_data(as_text=True)


def test_admin_page_pages_through_results(app, client):
    for n in range(25):
        indexed(app, f"doi:10.1/{n:02d}", f"spectroscopy paper {n}")
    sign_in(app, client)
    first = client.get("/admin/search?q=spectroscopy").get_data(as_text=True)
    assert "25 papers" in first and first.count('class="result"') == 20
    assert re.search(r'href="/admin/search\?q=spectroscopy&amp;offset=20">Next', first)
    second = client.get("/admin/search?q=spectroscopy&offset=20").get_data(as_text=True)
    assert second.count('class="result"') == 5 and "Previous" in second and "Next" not in second


def test_admin_page_is_refused_to_non_admins(app, client):
    assert client.get("/admin/search?q=x").status_code in (302, 303)  # to sign-in
    sign_in(app, client, "just-worker", roles=("worker",))
    assert client.get("/admin/search?q=x").status_code == 403


def test_json_route(app, client, admin_token, make_user):
    indexed(app, "doi:10.1/a", f"{INTRO}\f{METHODS}")
    auth = {"Authorization": f"Bearer {admin_token}"}
    response = client.get("/api/v1/admin/search?q=crawling&limit=5", headers=auth)
    assert response.status_code == 200
    found = body(response)
    assert (found["total"], found["limit"], found["offset"], found["project_id"]) == (1, 5, 0, None)
    [hit] = found["results"]
    assert (hit["canonical_key"], hit["page"], hit["job_id"]) == ("doi:10.1/a", 2, None)
    assert {"text": "crawling", "match": True} in hit["snippet"]

    assert body(client.get("/api/v1/admin/search?q=crawling&project=p2", headers=auth))["results"] == []
    err = api_error(client.get("/api/v1/admin/search?q=%21%21%21", headers=auth), 400, "invalid_request")
    assert "no searchable word" in err["message"] and err["details"] == {"field": "q"}
    api_error(client.get("/api/v1/admin/search", headers=auth), 400, "invalid_request")
    api_error(client.get("/api/v1/admin/search?q=x&limit=101", headers=auth), 400, "invalid_request")
    worker = make_user("w", ["worker"])
    api_error(client.get("/api/v1/admin/search?q=x", headers={"Authorization": f"Bearer {worker}"}),
              403, "permission_denied")


def test_a_search_past_the_timeout_is_refused_and_the_transaction_goes_on(app, monkeypatch):
    # Two words on every page, never side by side: the phrase rechecks all pages.
    filler = " ".join(f"w{n}" for n in range(300))
    indexed(app, "doi:10.1/long", "\f".join(f"alpha {filler} beta" for _ in range(2000)))
    monkeypatch.setattr(query, "SEARCH_TIMEOUT_MS", 1)
    with app.app_context():
        with pytest.raises(InvalidRequest, match="the search took longer than 0.001 s: narrow it") as exc:
            query.search('"alpha beta"')
        assert exc.value.details == {"field": "q", "timeout_ms": 1}
        # The caller's transaction is intact and the settings are back.
        assert db.session.execute(db.text("SELECT current_setting('statement_timeout'), "
                                          "current_setting('plan_cache_mode')")).one() == ("0", "auto")
        monkeypatch.setattr(query, "SEARCH_TIMEOUT_MS", 5000)
        assert query.search("alpha")["total"] == 1
        db.session.remove()
