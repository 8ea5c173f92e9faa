"""Site keys (issue "Polite at fleet scale" §1): every job knows the
publisher its fetch reaches, from enqueue on; the job pages show it and the
job search finds by it."""
from __future__ import annotations

import re

import pytest

from app.sites import keys
from tests.helpers import body, sql
from tests.support.pages import Pages, sign_in


@pytest.mark.parametrize("value, site", [
    ("10.1016/j.cell.2020.01.001", "10.1016"),            # a DOI: its registrant prefix
    ("doi:10.1000.10/ABC", "10.1000.10"),                 # a sub-prefix is a prefix of its own
    ("https://doi.org/10.1038/nature12373", "10.1038"),   # a DOI link: the DOI, not doi.org
    ("arXiv:2101.00001v2", "arxiv.org"),
    ("https://arxiv.org/abs/hep-th/9901001", "arxiv.org"),
    ("https://www.sciencedirect.com/science/article/pii/S1", "sciencedirect.com"),
    ("https://a.b.example.co.uk/x", "example.co.uk"),     # the public suffix list, not "last two labels"
    ("https://alice.github.io/paper.pdf", "alice.github.io"),  # a private suffix: each user is a site
    ("HTTPS://WWW.Example.COM.:443/", "example.com"),
    ("https://例え.jp/論文", "xn--r8jz45g.jp"),              # IDNA, as browsers resolve it
    ("http://127.0.0.1:8080/p.pdf", "127.0.0.1"),         # an address stands for itself
    ("http://[::1]/p.pdf", "::1"),
    ("http://localhost:5000/p.pdf", "localhost"),
    ("https://user:pw@www.Example.org/x", "example.org"),  # user info, as urlsplit reads it
    (" https://www.example.org/x", "example.org"),        # surrounding spaces are stripped
    ("https://www.exa\tmple.org/x", "example.org"),       # and tabs removed, as by browsers
    ("https://www.example.org:80a/x", "example.org"),     # a broken port: the host still counts
    ("item-42", None),                                    # a generic value names no site
    ("http://[zz]/", None),
])
def test_site_key_of_a_value(value, site):
    assert keys.for_value(value) == site


def test_a_job_over_the_spec_size_is_refused_though_each_field_fits():
    """32 KiB per job as JSON: 8,000 control characters are 8,000 bytes of
    value but 48,000 of JSON (each one escaped as \\u0001)."""
    from workers.wire.protocol import MAX_SPEC_BYTES, SpecError, normalize_jobspec
    assert normalize_jobspec({"value": "x" * 8000, "via": "y" * 8000}, "none")["value"]
    with pytest.raises(SpecError, match=f"at most {MAX_SPEC_BYTES} bytes"):
        normalize_jobspec({"value": "\x01" * 8000}, "none")


def test_a_job_may_name_its_site_and_a_bad_name_is_refused():
    assert keys.for_value("https://cdn.example.net/x", {"fleethq_site": " Elsevier "}) == "elsevier"
    for bad in ("", "-x", "a b", "x" * 254, 7, "ü"):
        with pytest.raises(keys.InvalidSiteKey):
            keys.for_value("https://example.org/", {"fleethq_site": bad})


def _sites(app, project):
    return dict(sql(app, "SELECT value, site_key FROM jobs WHERE project_id = :p", p=project))


def test_enqueue_stores_the_site_and_the_job_views_show_it(api, app):
    api.put_project("papers", kind="pdf", identity_mode="unique_value")
    values = ["10.1016/a.1", "https://www.nature.com/articles/x", "arXiv:2101.00001"]
    assert api.enqueue("papers", [{"value": v} for v in values]).status_code == 200
    assert _sites(app, "papers") == dict(zip(values, ["10.1016", "nature.com", "arxiv.org"]))
    listed = body(api.call("GET", "/api/v1/fleethq/projects/papers/jobs"))["jobs"]
    assert sorted(j["site"] for j in listed) == ["10.1016", "arxiv.org", "nature.com"]
    one = body(api.call("GET", f"/api/v1/fleethq/projects/papers/jobs/{listed[0]['job_id']}"))
    assert one["site"] == listed[0]["site"]
    # SavewebHQ's own job view keeps its contract: no new key there.
    contract = body(api.call("GET", "/api/v1/admin/projects/papers/jobs"))["jobs"]
    assert all("site" not in j for j in contract)


def test_generic_values_and_named_sites(api, app):
    api.put_project("crawl", identity_mode="none")
    specs = [{"value": "https://cdn.example.net/a"}, {"value": "plain text"},
             {"value": "https://cdn.example.net/b", "attr": {"fleethq_site": "Elsevier"}}]
    assert api.enqueue("crawl", specs).status_code == 200
    assert _sites(app, "crawl") == {"https://cdn.example.net/a": "example.net", "plain text": None,
                                    "https://cdn.example.net/b": "elsevier"}


def test_a_bad_named_site_refuses_the_batch_and_keeps_nothing(api, app):
    api.put_project("crawl", identity_mode="none")
    response = api.enqueue("crawl", [{"value": "https://example.org/ok"},
                                     {"value": "https://example.org/x", "attr": {"fleethq_site": "a b"}}])
    assert response.status_code == 400
    error = body(response)["error"]
    assert error["details"]["index"] == 1 and error["details"]["field"] == "attr"
    assert "fleethq_site" in error["message"]
    assert _sites(app, "crawl") == {}


def test_job_pages_show_the_site_and_search_finds_by_it(api, app, client):
    api.put_project("papers", kind="pdf", identity_mode="unique_value")
    api.enqueue("papers", [{"value": v} for v in ("10.1016/a", "10.1016/b", "10.1038/c")])
    sign_in(app, client)
    pages = Pages(client, "page-admin")
    found = pages.text("/admin/projects/papers/jobs/search?site=10.1016")
    section = found.split('id="job-search-results"', 1)[-1]
    ids = re.findall(r'<td class="num"><a href="/admin/jobs/(\d+)">', section)
    assert len(ids) == 2
    assert "10.1038" not in section
    # the key is read as stored: lowercase
    assert re.findall(r'href="/admin/jobs/(\d+)"', pages.text(
        "/admin/projects/papers/jobs/search?site=ARXIV.ORG").split('id="job-search-results"', 1)[-1]) == []
    job = pages.text(f"/admin/jobs/{ids[0]}")
    assert re.search(r'id="job-site"><a href="/admin/projects/papers/jobs/search\?site=10.1016">10.1016</a>', job)


def test_rekey_gives_old_and_imported_jobs_their_site(api, app):
    api.put_project("papers", kind="pdf", identity_mode="unique_value")
    api.enqueue("papers", [{"value": v} for v in ("10.1016/a", "https://www.nature.com/x")])
    sql(app, "UPDATE jobs SET site_key = NULL")  # as before migration 0020
    runner = app.test_cli_runner()
    result = runner.invoke(args=["fleet", "sites", "rekey", "--project", "papers"])
    assert result.exit_code == 0, result.output
    assert '"keyed": 2' in result.output
    assert set(_sites(app, "papers").values()) == {"10.1016", "nature.com"}
