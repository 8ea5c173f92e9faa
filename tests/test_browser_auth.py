"""Sign-in through a real browser: Debian Chromium driven by Playwright
against the master on a live HTTP server, signing in through the GitHub
stand-in (browser → app → stand-in → app, all real HTTP on loopback).

Screenshots land in ``test-artifacts/screenshots/`` (not committed).
Chromium missing is a failure, not a skip.
"""
from __future__ import annotations


import pytest

from tests.browser import SHOTS, browser  # noqa: F401  (fixture)



@pytest.fixture
def site(app, live_server, standin, monkeypatch):
    for key, value in standin.settings().items():
        monkeypatch.setitem(app.config, key, value)
    standin.reset()
    return live_server


@pytest.fixture
def new_page(browser):
    """Fresh browser contexts (separate cookie jars); CSP violations fail the test."""
    contexts, violations = [], []

    def make():
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        contexts.append(context)
        page = context.new_page()
        page.on("console", lambda msg: violations.append(msg.text)
                if "Content Security Policy" in msg.text else None)
        page.set_default_timeout(15_000)
        return page

    yield make
    for context in contexts:
        context.close()
    assert violations == []


def shot(page, name):
    page.screenshot(path=str(SHOTS / f"auth-{name}.png"), full_page=True)


def github_sign_in(page, site, standin, login):
    standin.sign_in_as(login)
    page.goto(f"{site.url}/login")
    page.click("#github-login")
    page.wait_for_load_state()


def test_admin_signs_in_through_the_browser(site, standin, new_page):
    standin.add_to_team("alice")
    page = new_page()
    page.goto(f"{site.url}/login")
    shot(page, "login")
    github_sign_in(page, site, standin, "alice")
    page.wait_for_url(f"{site.url}/admin")
    shot(page, "admin-landing")
    page.goto(f"{site.url}/worker")
    assert page.locator("h1").inner_text() == "My worker"
    assert page.locator(".signout .who").inner_text() == "alice"
    assert page.locator(".mainnav a", has_text="Users").count() == 1  # admin navigation
    shot(page, "admin-worker-page")
    # Signing out ends it: the protected page sends the browser to /login.
    page.click(".signout button")
    page.wait_for_url(f"{site.url}/login")
    page.goto(f"{site.url}/worker")
    assert page.url.startswith(f"{site.url}/login")


def test_non_member_waits_then_is_activated_and_generates_a_token(app, site, standin, new_page):
    from app.accounts import service as accounts
    from app.extensions import db
    page = new_page()
    github_sign_in(page, site, standin, "bob")
    assert page.locator("#pending h1").inner_text() == "Waiting for approval"
    shot(page, "pending")
    page.goto(f"{site.url}/worker")
    assert page.url.startswith(f"{site.url}/login")  # no session was given

    with app.app_context():  # the admin's approval (the admin pages do this in the product)
        accounts.put_user(standin.user_id("bob"), ["worker"], "active")
        db.session.remove()

    github_sign_in(page, site, standin, "bob")
    page.wait_for_url(f"{site.url}/worker")
    assert "You have no machine token." in page.inner_text("#token")
    page.click("#rotate-token")
    page.wait_for_selector("#new-token")
    token = page.inner_text("#new-token")
    assert token.startswith("fhq_")
    shot(page, "worker-token")

    api = page.context.request
    who = api.get(f"{site.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert who.status == 200 and who.json()["user_id"] == standin.user_id("bob")
    # The browser's own session cookie does not reach the machine API.
    assert api.get(f"{site.url}/api/v1/whoami").status == 401

    page.goto(f"{site.url}/worker")
    assert token not in page.content()  # not in the page until asked for
    page.click("#view-token")
    page.wait_for_selector("#current-token")
    assert page.inner_text("#current-token") == token
    page.goto(f"{site.url}/worker")
    assert token not in page.content()
    page.click("#revoke-token")
    page.wait_for_url(f"{site.url}/worker")
    assert "Machine token revoked" in page.inner_text("main")
    shot(page, "worker-revoked")
    assert api.get(f"{site.url}/api/v1/whoami",
                   headers={"Authorization": f"Bearer {token}"}).status == 401
