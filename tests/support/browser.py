"""Headless Chromium on the pages: the ``site`` (a live server, signed in)
and a ``page`` opened on it."""
from __future__ import annotations

import pytest
import requests

from tests.helpers import Api
from tests.browser import SHOTS, browser  # noqa: F401  (fixture)


@pytest.fixture
def site(app, live_server, monkeypatch):
    from app.pages import aggregates
    monkeypatch.setitem(app.config, "DEV_MODE", True)  # the dev login exists only in dev mode
    aggregates.reset_cache()
    return live_server


@pytest.fixture
def page(browser, site):
    """A signed-in admin's tab; CSP violations and dialogs fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    problems = []
    tab.on("console", lambda msg: problems.append(msg.text)
           if "Content Security Policy" in msg.text else None)
    tab.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    tab.set_default_timeout(15_000)
    tab.goto(f"{site.url}/login")
    tab.click("#dev-login")
    tab.wait_for_url(f"{site.url}/admin")
    yield tab
    context.close()
    assert problems == []


@pytest.fixture
def api(site, admin_token):
    """The admin API over HTTP on the same live site as the browser."""
    return Api(requests.Session(), admin_token, base=site.url)
