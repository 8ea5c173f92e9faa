"""The admin pages as a signed-in browser sees them, for every page test:
``sign_in`` (a session for a user with roles), ``Pages`` (GET and POST with
the form's CSRF token) and the ``pages`` fixture."""
from __future__ import annotations

import html
import re

import pytest

XSS = "<script>alert(1)</script>"

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')

FLASH_RE = re.compile(r'<p class="flash flash-(\w+)" role="status">(.*?)</p>', re.S)


class Pages:
    """A signed-in admin browsing with the test client: CSRF tokens included."""

    def __init__(self, client, user_id: str):
        self.client, self.user_id = client, user_id
        self.token = CSRF_RE.search(self.get("/admin/projects").get_data(as_text=True)).group(1)

    def get(self, url, **kw):
        return self.client.get(url, **kw)

    def text(self, url) -> str:
        response = self.get(url)
        assert response.status_code == 200, (url, response.status_code)
        return response.get_data(as_text=True)

    def post(self, url, data=None, **kw):
        return self.client.post(url, data={"csrf_token": self.token, **(data or {})}, **kw)

    def act(self, url, data=None, *, expect="success", **kw) -> tuple[str, str]:
        """POST, check the 303, follow it; return (flash message, page HTML)."""
        response = self.post(url, data, **kw)
        assert response.status_code == 303, (url, response.status_code, response.get_data(as_text=True)[:500])
        page = self.get(response.headers["Location"])
        assert page.status_code == 200, (response.headers["Location"], page.status_code)
        html_text = page.get_data(as_text=True)
        flashes = [(cat, html.unescape(msg)) for cat, msg in FLASH_RE.findall(html_text)]
        assert flashes, html_text[:2000]
        category, message = flashes[-1]
        assert category == expect, (category, message)
        return message, html_text


def sign_in(app, client, user_id="page-admin", roles=("admin", "worker")):
    """flask-login's session key set to a server-side session (app.pages.sessions)."""
    from app.accounts import service as accounts
    from app.extensions import db
    from app.pages import sessions
    with app.app_context():
        accounts.put_user(user_id, list(roles), "active")
        session_id = sessions.start(user_id, 3600)
        db.session.remove()
    with client.session_transaction() as session:
        session["_user_id"] = session_id
        session["_fresh"] = True


@pytest.fixture
def pages(app, client):
    from app.pages import aggregates
    aggregates.reset_cache()  # cached minutes of an earlier test's attempts
    sign_in(app, client)
    return Pages(client, "page-admin")
