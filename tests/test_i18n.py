"""Pages in English and Simplified Chinese (issue "Pages an operator lives
in" §1): every page string has a Chinese translation, the language comes
from the URL prefix, the cookie or Accept-Language, numbers and dates follow
it, and the machine API stays English."""
from __future__ import annotations

import os
import subprocess
import sys

from babel.messages.pofile import read_po

from tests.helpers import Api, api_error
from tests.support.pages import Pages, sign_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATALOG = os.path.join(ROOT, "app", "translations", "zh", "LC_MESSAGES", "messages.po")


def _extracted(tmp_path) -> set:
    """Every string the pages and their code mark for translation, as pybabel sees them now."""
    pot = tmp_path / "messages.pot"
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "pybabel"), "extract",
                    "-F", "babel.cfg", "-k", "lazy_gettext", "-o", str(pot), "."],
                   cwd=ROOT, check=True, capture_output=True)
    with open(pot, "rb") as f:
        return {m.id if isinstance(m.id, str) else m.id[0] for m in read_po(f) if m.id}


def test_every_page_string_has_a_chinese_translation(tmp_path):
    with open(CATALOG, "rb") as f:
        catalog = read_po(f, locale="zh")
    translated = {}
    for m in catalog:
        if not m.id:
            continue
        key = m.id if isinstance(m.id, str) else m.id[0]
        strings = [m.string] if isinstance(m.string, str) else list(m.string)
        if all(s.strip() for s in strings) and "fuzzy" not in m.flags:
            translated[key] = strings
    wanted = _extracted(tmp_path)
    missing = sorted(wanted - set(translated))
    assert not missing, f"{len(missing)} page strings without a Chinese translation " \
                        f"(make translations-update, then translate): {missing[:10]}"
    assert len(wanted) > 100
    # A translation keeps the placeholders of its English string.
    for m in catalog:
        if m.id and m.python_format:
            for english, chinese in zip([m.id] if isinstance(m.id, str) else m.id,
                                        [m.string] if isinstance(m.string, str) else m.string):
                assert sorted(_names(english)) == sorted(_names(chinese)) or not chinese, (english, chinese)


def _names(text: str) -> list[str]:
    import re
    return re.findall(r"%\((\w+)\)s", text)


def test_the_language_comes_from_the_prefix_then_the_cookie_then_accept_language(app, client):
    page = client.get("/zh/login")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert 'lang="zh-Hans"' in text and "<h1>登录 FleetHQ</h1>" in text
    assert "lang=zh" in page.headers["Set-Cookie"]
    assert "登录 FleetHQ" in client.get("/login").get_data(as_text=True)  # the cookie remembers
    assert "Sign in to FleetHQ" in client.get("/en/login").get_data(as_text=True)
    assert "Sign in to FleetHQ" in client.get("/login").get_data(as_text=True)  # and switches back
    fresh = app.test_client()
    assert "登录 FleetHQ" in fresh.get("/login", headers={"Accept-Language": "zh-CN,zh;q=0.9"}).get_data(
        as_text=True)
    assert "Sign in to FleetHQ" in app.test_client().get(
        "/login", headers={"Accept-Language": "de-DE,de;q=0.9"}).get_data(as_text=True)
    missing = app.test_client().get("/zh/no-such-page")
    assert missing.status_code == 404 and "未找到" in missing.get_data(as_text=True)


def test_links_on_a_chinese_page_stay_chinese_and_the_switcher_keeps_the_page(app, client):
    sign_in(app, client)
    page = client.get("/zh/admin/projects").get_data(as_text=True)
    assert 'href="/zh/admin/workers"' in page and 'href="/zh/admin/projects"' in page
    assert 'href="/en/admin/projects" hreflang="en"' in page
    assert ">工作节点<" in page and ">仪表盘<" in page


def test_the_switcher_stays_under_a_master_mounted_on_a_sub_path(app):
    """Behind a proxy that mounts the master at /hq (SCRIPT_NAME), the
    switcher's links keep the mount, as every url_for link does."""
    page = app.test_client().get("/zh/login", base_url="http://localhost/hq").get_data(as_text=True)
    assert 'href="/hq/en/login" hreflang="en"' in page and 'href="/hq/zh/login" hreflang="zh"' in page
    plain = app.test_client().get("/login", base_url="http://localhost/hq").get_data(as_text=True)
    assert 'href="/hq/zh/login" hreflang="zh"' in plain


def test_numbers_and_dates_follow_the_language(app, client, admin_token):
    from app import i18n
    with app.test_request_context("/admin", headers={"Cookie": "lang=zh"}):
        assert i18n.utc_time(1764615829) == "2025年12月1日 19:03:49 UTC"
        assert 'title="2025年12月1日 19:03:49 UTC · 1764615829"' in i18n.time_tag(1764615829)
        assert i18n.span(180) == "3分钟"
        assert i18n.number(1234567) == "1,234,567"
    with app.test_request_context("/admin", headers={"Cookie": "lang=en"}):
        assert i18n.utc_time(1764615829) == "2025-12-01 19:03:49 UTC"
        assert '<time datetime="2025-12-01T19:03:49Z"' in i18n.time_tag(1764615829)
        assert i18n.span(180) == "3 minutes"


def test_the_machine_api_stays_english(app, client, admin_token):
    api = Api(client, admin_token)
    answer = client.get("/zh/api/v1/projects/none/jobs/nope", headers={
        "Authorization": f"Bearer {admin_token}", "Accept-Language": "zh-CN"})
    assert answer.status_code == 404
    assert answer.get_json()["error"]["message"].isascii()
    response = api.call("GET", "/api/v1/fleethq/projects/none")
    api_error(response, 404, "not_found")
    assert response.get_json()["error"]["message"].isascii()


def test_the_oauth_callback_and_the_enrollment_command_carry_no_language_prefix(app, client):
    """GitHub only accepts the callback URL registered for the OAuth app, and a
    worker's master URL is the master's, whatever language the page is in."""
    sign_in(app, client)
    token = Pages(client, "page-admin").token
    shown = client.post("/zh/admin/workers/enrollments", data={"csrf_token": token}).get_data(as_text=True)
    assert "fleethq-worker run --master http://localhost " in shown
    with app.test_request_context("/zh/login", environ_overrides={"SCRIPT_NAME": "/zh"}):
        from app.pages import auth
        assert auth._callback_url() == "http://localhost" + app.config["GITHUB_CALLBACK_PATH"]
