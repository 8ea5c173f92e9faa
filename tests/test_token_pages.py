"""Viewing a machine token again on the pages (D17, D20): behind a
CSRF-protected POST, never in a page by default, never cached."""
from __future__ import annotations

import html
import re

import pytest

from app.accounts import service as accounts
from tests.helpers import sql
from tests.support.pages import CSRF_RE, sign_in

SHOWN = re.compile(r'id="(machine-token|current-token|new-token)">([^<]+)<')


def _shown(response) -> tuple[str, str] | None:
    match = SHOWN.search(response.get_data(as_text=True))
    return (match.group(1), html.unescape(match.group(2))) if match else None


def _row(page: str, user_id: str) -> str:
    """The users-table row of one user."""
    rows = re.findall(r'<tr id="user-\d+">(.*?)</tr>', page, re.S)
    (row,) = [r for r in rows if f'<code class="muted">{user_id}</code>' in r]
    return row


@pytest.fixture
def carried(app):
    with app.app_context():
        accounts.put_user("wk", ["worker"])
        accounts.install_token("wk", "hq_carried<&>over")
    return "hq_carried<&>over"


def test_admin_views_a_users_token_again(pages, carried):
    page = pages.text("/admin/users")
    assert carried not in html.unescape(page)
    row = _row(page, "wk")
    assert 'data-active="true" data-viewable="true"' in row and "View token" in row

    for _ in range(2):  # repeatable
        response = pages.post("/admin/users/wk/token/view")
        assert response.status_code == 200
        assert response.headers["Cache-Control"] == "no-store"
        assert _shown(response) == ("machine-token", carried)
        assert "The current token." in response.get_data(as_text=True)


def test_viewing_needs_the_csrf_token(pages, carried):
    for data in ({}, {"csrf_token": "forged"}):
        response = pages.client.post("/admin/users/wk/token/view", data=data)
        assert response.status_code == 400 and _shown(response) is None


def test_a_token_that_cannot_be_shown_is_explained(app, pages, carried):
    sql(app, "UPDATE machine_tokens SET sealed = NULL")
    row = _row(pages.text("/admin/users"), "wk")
    assert 'data-viewable="false"' in row and "not viewable" in row and "View token" not in row
    message, _ = pages.act("/admin/users/wk/token/view", expect="error")
    assert "cannot be shown" in message
    message, _ = pages.act("/admin/users/ghost/token/view", expect="error")
    assert "cannot be shown" in message


def test_a_rotated_token_says_it_can_be_viewed_again(pages, carried):
    response = pages.post("/admin/users/wk/token")
    kind, token = _shown(response)
    assert kind == "machine-token" and token.startswith("fhq_")
    assert "It can be viewed again from the users page." in response.get_data(as_text=True)
    assert _shown(pages.post("/admin/users/wk/token/view")) == ("machine-token", token)


def _worker_page(app, client, user_id="gh-9") -> str:
    sign_in(app, client, user_id, roles=("worker",))
    return CSRF_RE.search(client.get("/worker").get_data(as_text=True)).group(1)


def test_worker_views_their_own_token_again(app, client):
    csrf = _worker_page(app, client)
    assert "View token" not in client.get("/worker").get_data(as_text=True)  # no token yet
    rotated = client.post("/worker/token", data={"csrf_token": csrf})
    kind, token = _shown(rotated)
    assert kind == "new-token" and "You can view it again here later." in rotated.get_data(as_text=True)

    page = client.get("/worker")
    assert token not in page.get_data(as_text=True) and 'id="view-token"' in page.get_data(as_text=True)
    for _ in range(2):
        viewed = client.post("/worker/token/view", data={"csrf_token": csrf})
        assert viewed.status_code == 200 and viewed.headers["Cache-Control"] == "no-store"
        assert _shown(viewed) == ("current-token", token)
    assert client.post("/worker/token/view").status_code == 400  # no CSRF token

    client.post("/worker/token/revoke", data={"csrf_token": csrf})
    gone = client.post("/worker/token/view", data={"csrf_token": csrf})
    assert gone.status_code == 303 and gone.headers["Location"].endswith("/worker")
    assert "cannot be shown again" in client.get("/worker").get_data(as_text=True)


def test_worker_page_without_viewable_tokens(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "MACHINE_TOKENS_VIEWABLE", False)
    csrf = _worker_page(app, client)
    rotated = client.post("/worker/token", data={"csrf_token": csrf})
    assert "shown once" in rotated.get_data(as_text=True)
    page = client.get("/worker").get_data(as_text=True)
    assert 'id="view-token"' not in page and "It cannot be viewed again." in page
