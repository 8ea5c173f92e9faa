"""Sign-in and page security (DESIGN §10, §11): the Flask test client drives
the app, the app talks to the GitHub stand-in over real HTTP, and the test
plays the browser's part of following the redirect through the stand-in."""
from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from sqlalchemy import text


CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
TOKEN = re.compile(r'id="new-token">(fhq_[A-Za-z0-9_-]+)<')


@pytest.fixture
def github(app, standin, monkeypatch):
    for key, value in standin.settings().items():
        monkeypatch.setitem(app.config, key, value)
    standin.reset()
    return standin


def csrf(client, path="/login") -> str:
    page = client.get(path)
    assert page.status_code == 200, page.status_code
    return CSRF.search(page.get_data(as_text=True)).group(1)


def sign_in(app, github, login, client=None):
    """A whole GitHub sign-in; returns (client, callback response)."""
    client = client or app.test_client()
    github.sign_in_as(login)
    start = client.get("/login/github")
    assert start.status_code == 303
    assert start.headers["Location"].startswith(github.url + "/login/oauth/authorize?")
    approved = requests.get(start.headers["Location"], allow_redirects=False, timeout=10)
    assert approved.status_code == 302, approved.text
    back = urlsplit(approved.headers["Location"])
    assert back.path == "/login/github/callback"
    return client, client.get(f"{back.path}?{back.query}")


def query(app, sql, **params):
    from app.extensions import db
    with app.app_context():
        try:
            return db.session.execute(text(sql), params).all()
        finally:
            db.session.remove()


def execute(app, sql, **params):
    from app.extensions import db
    with app.app_context():
        db.session.execute(text(sql), params)
        db.session.commit()
        db.session.remove()


def set_status(app, user_id, roles, status):
    from app.accounts import service as accounts
    from app.extensions import db
    with app.app_context():
        accounts.put_user(user_id, roles, status)
        db.session.remove()


def rotate_on_page(client) -> str:
    page = client.post("/worker/token", data={"csrf_token": csrf(client, "/worker")})
    assert page.status_code == 200
    assert page.headers["Cache-Control"] == "no-store"
    return TOKEN.search(page.get_data(as_text=True)).group(1)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


# ------------------------------------------------------------------ sign-in


def test_team_member_signs_in_as_admin(app, github):
    github.add_to_team("alice")
    client, done = sign_in(app, github, "alice")
    assert done.status_code == 303 and done.headers["Location"] == "/admin"
    uid = github.user_id("alice")
    assert query(app, "SELECT status, roles, github_login FROM users WHERE id = :u", u=uid) == \
        [("active", ["admin", "worker"], "alice")]
    assert client.get("/admin").status_code == 200
    assert "alice" in client.get("/worker").get_data(as_text=True)
    # The flow used PKCE S256 with scope read:org, and the verifier matched.
    authorize = github.authorize_params[-1]
    assert authorize["code_challenge_method"] == "S256" and authorize["scope"] == "read:org"
    assert github.token_requests[-1]["code_verifier"]


def test_github_access_token_is_never_stored(app, github):
    github.add_to_team("alice")
    client, done = sign_in(app, github, "alice")
    assert done.status_code == 303
    issued = list(github.tokens)
    assert issued
    cookie = client.get_cookie("session").value
    payload = app.session_interface.get_signing_serializer(app).loads(cookie)
    stored = str(payload) + str(query(app, "SELECT u::text FROM users u")) \
        + str(query(app, "SELECT s::text FROM page_sessions s"))
    assert not any(token in stored for token in issued)


def test_non_member_is_pending_without_a_session(app, github):
    client, done = sign_in(app, github, "bob")
    assert done.status_code == 200
    assert "Waiting for approval" in done.get_data(as_text=True)
    uid = github.user_id("bob")
    assert query(app, "SELECT status, roles FROM users WHERE id = :u", u=uid) == [("pending", ["worker"])]
    assert query(app, "SELECT count(*) FROM page_sessions") == [(0,)]
    assert client.get("/worker").status_code == 302
    # Signing in again changes nothing until an admin acts.
    _, again = sign_in(app, github, "bob")
    assert "Waiting for approval" in again.get_data(as_text=True)


def test_activated_user_reaches_worker_page(app, github):
    sign_in(app, github, "carol")
    uid = github.user_id("carol")
    set_status(app, uid, ["worker"], "active")
    client, done = sign_in(app, github, "carol")
    assert done.status_code == 303 and done.headers["Location"] == "/worker"
    page = client.get("/worker")
    assert page.status_code == 200 and "My worker" in page.get_data(as_text=True)
    assert client.get("/admin").status_code == 403


def test_token_generated_on_worker_page_works_for_the_api(app, github):
    sign_in(app, github, "dave")
    set_status(app, github.user_id("dave"), ["worker"], "active")
    client, _ = sign_in(app, github, "dave")
    token = rotate_on_page(client)
    who = client.get("/api/v1/whoami", headers=bearer(token))
    assert who.status_code == 200 and who.get_json()["user_id"] == github.user_id("dave")
    # The page never shows it again.
    assert token not in client.get("/worker").get_data(as_text=True)
    newer = rotate_on_page(client)
    assert client.get("/api/v1/whoami", headers=bearer(token)).status_code == 401
    revoked = client.post("/worker/token/revoke", data={"csrf_token": csrf(client, "/worker")})
    assert revoked.status_code == 303
    assert client.get("/api/v1/whoami", headers=bearer(newer)).status_code == 401


def test_member_removed_from_team_loses_admin_at_next_login(app, github):
    github.add_to_team("erin")
    first, _ = sign_in(app, github, "erin")
    token = rotate_on_page(first)
    assert first.get("/api/v1/admin/users", headers=bearer(token)).status_code == 200

    github.remove_from_team("erin")
    second, done = sign_in(app, github, "erin")
    assert done.headers["Location"] == "/worker"
    assert query(app, "SELECT status, roles FROM users WHERE id = :u", u=github.user_id("erin")) == \
        [("active", ["worker"])]
    # Roles are read per request: every open session and the token lose admin.
    assert second.get("/admin").status_code == 403
    assert first.get("/admin").status_code == 403
    assert first.get("/api/v1/admin/users", headers=bearer(token)).status_code == 403
    assert first.get("/api/v1/whoami", headers=bearer(token)).status_code == 200

    github.add_to_team("erin")
    _, back = sign_in(app, github, "erin")
    assert back.headers["Location"] == "/admin"


def test_callback_needs_the_matching_state_and_a_fresh_code(app, github):
    client = app.test_client()
    github.sign_in_as("frank")
    start = client.get("/login/github")
    approved = requests.get(start.headers["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(approved.headers["Location"])
    params = parse_qs(back.query)
    for state in ("forged", "f%C3%B6rged"):
        forged = client.get(f"{back.path}?code={params['code'][0]}&state={state}")
        assert forged.status_code == 400
    # The state is single-use: the real callback after the forged one fails too.
    assert client.get(f"{back.path}?{back.query}").status_code == 400
    assert query(app, "SELECT count(*) FROM page_sessions") == [(0,)]


def test_next_is_kept_but_only_for_local_paths(app, github):
    github.add_to_team("gina")
    client = app.test_client()
    assert client.get("/worker").headers["Location"] == "/login?next=/worker"
    page = client.get("/login?next=/worker").get_data(as_text=True)
    assert 'href="/login/github?next=/worker"' in page
    assert 'href="/login/github"' in client.get("/login?next=//evil.example/x").get_data(as_text=True)
    github.sign_in_as("gina")
    start = client.get("/login/github?next=/worker")
    approved = requests.get(start.headers["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(approved.headers["Location"])
    assert client.get(f"{back.path}?{back.query}").headers["Location"] == "/worker"
    assert client.get("/login?next=https://evil.example/").headers["Location"] == "/admin"


# ----------------------------------------------------------------- sessions


def test_logout_ends_the_session_server_side(app, github):
    github.add_to_team("hank")
    client, _ = sign_in(app, github, "hank")
    cookie = client.get_cookie("session").value
    out = client.post("/logout", data={"csrf_token": csrf(client, "/worker")})
    assert out.status_code == 303 and out.headers["Location"] == "/login"
    assert client.get("/worker").status_code == 302
    # Replaying the cookie captured before logout no longer signs anyone in.
    replay = app.test_client()
    replay.set_cookie("session", cookie)
    assert replay.get("/worker").status_code == 302


def test_suspended_or_deleted_user_loses_the_session(app, github):
    from app.accounts import service as accounts
    from app.extensions import db
    sign_in(app, github, "ivy")
    uid = github.user_id("ivy")
    set_status(app, uid, ["worker"], "active")
    client, _ = sign_in(app, github, "ivy")
    assert client.get("/worker").status_code == 200
    set_status(app, uid, ["worker"], "suspended")
    assert client.get("/worker").status_code == 302
    # A suspended user cannot sign in again, team or not.
    github.add_to_team("ivy")
    again, refused = sign_in(app, github, "ivy")
    assert refused.status_code == 403 and again.get("/worker").status_code == 302

    set_status(app, uid, ["worker"], "active")
    assert client.get("/worker").status_code == 200  # the record was still there
    with app.app_context():
        accounts.delete_user(uid)
        db.session.remove()
    assert client.get("/worker").status_code == 302
    assert query(app, "SELECT count(*) FROM page_sessions") == [(0,)]


def test_end_user_sessions_signs_out_every_browser(app, github):
    from app.extensions import db
    from app.pages import sessions
    github.add_to_team("jack")
    one, _ = sign_in(app, github, "jack")
    two, _ = sign_in(app, github, "jack")
    sign_in(app, github, "jack", client=one)  # signing in again replaces that browser's session
    with app.app_context():
        assert sessions.count_active(github.user_id("jack")) == 2
        assert sessions.end_user_sessions(github.user_id("jack")) == 2
        db.session.remove()
    assert one.get("/worker").status_code == 302 and two.get("/worker").status_code == 302


def test_session_cookie_flags(app, github):
    github.add_to_team("kim")
    client = app.test_client()
    github.sign_in_as("kim")
    start = client.get("/login/github")
    approved = requests.get(start.headers["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(approved.headers["Location"])
    done = client.get(f"{back.path}?{back.query}")
    cookie = done.headers["Set-Cookie"]
    assert cookie.startswith("session=")
    for flag in ("HttpOnly", "SameSite=Lax", "Secure", "Expires="):
        assert flag in cookie, cookie


def test_cookie_is_secure_except_in_plain_http_development():
    from app.pages.security import _cookie_secure
    assert _cookie_secure({"DEV_MODE": False}) is True
    assert _cookie_secure({"DEV_MODE": True}) is False
    assert _cookie_secure({"DEV_MODE": True, "PUBLIC_URL": "https://hq.example"}) is True
    assert _cookie_secure({"DEV_MODE": True, "PREFERRED_URL_SCHEME": "https"}) is True


# ----------------------------------------------------------- page security


def test_post_without_csrf_token_is_rejected(app, github):
    github.add_to_team("lou")
    client, _ = sign_in(app, github, "lou")
    for path in ("/worker/token", "/worker/token/revoke", "/logout"):
        response = client.post(path)
        assert response.status_code == 400, path
    assert client.post("/worker/token", data={"csrf_token": "forged"}).status_code == 400
    assert client.get("/worker").status_code == 200  # still signed in
    assert query(app, "SELECT count(*) FROM machine_tokens") == [(0,)]


def test_security_headers_on_pages_not_needed_on_api(app, github):
    github.add_to_team("max")
    client, _ = sign_in(app, github, "max")
    for path in ("/login", "/worker", "/static/style.css"):
        headers = client.get(path).headers
        assert headers["Content-Security-Policy"] == (
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"), path
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "same-origin"
    assert client.post("/logout").headers["X-Frame-Options"] == "DENY"  # error pages too
    html = client.get("/worker").get_data(as_text=True)
    assert not re.search(r"<script(?![^>]*\bsrc=)", html) and "style=" not in html


def test_user_data_is_escaped_on_the_worker_page(app, github):
    sign_in(app, github, "nina")
    uid = github.user_id("nina")
    set_status(app, uid, ["worker"], "active")
    execute(app, "INSERT INTO token_workers (user_id, worker_id, last_error) "
                 "VALUES (:u, 'w-1', '<script>alert(1)</script>')", u=uid)
    client, _ = sign_in(app, github, "nina")
    html = client.get("/worker").get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert "w-1" in client.get("/worker/workers").get_data(as_text=True)


def test_bearer_token_opens_no_page_and_session_calls_no_api(app, github, admin_token):
    for path in ("/admin", "/worker"):
        response = app.test_client().get(path, headers=bearer(admin_token))
        assert response.status_code == 302 and response.headers["Location"].startswith("/login")
    github.add_to_team("olga")
    client, _ = sign_in(app, github, "olga")
    assert client.get("/admin").status_code == 200
    for path in ("/api/v1/whoami", "/api/v1/admin/users"):
        assert client.get(path).status_code == 401, path


# -------------------------------------------------------------- dev login


def test_dev_login_only_in_dev_mode_on_loopback(app, github, monkeypatch):
    client = app.test_client()
    assert "dev-login" not in client.get("/login").get_data(as_text=True)
    # 404 whatever the method and before any CSRF check: the route does not exist.
    for method in (client.get, client.post, client.put):
        assert method("/login/dev", data={"csrf_token": "x"}).status_code == 404
    monkeypatch.setitem(app.config, "DEV_MODE", True)
    token = csrf(client)
    remote = {"REMOTE_ADDR": "10.1.2.3"}
    assert "dev-login" not in client.get("/login", environ_base=remote).get_data(as_text=True)
    assert client.post("/login/dev", data={"csrf_token": token}, environ_base=remote).status_code == 404
    proxied = {"X-Forwarded-For": "203.0.113.9"}
    assert client.post("/login/dev", data={"csrf_token": token}, headers=proxied).status_code == 404

    assert 'id="dev-login"' in client.get("/login").get_data(as_text=True)
    done = client.post("/login/dev", data={"csrf_token": token})
    assert done.status_code == 303 and done.headers["Location"] == "/admin"
    assert query(app, "SELECT status, roles FROM users WHERE id = 'dev-admin'") == \
        [("active", ["admin", "worker"])]
    assert client.get("/admin").status_code == 200


# ----------------------------------------------------------- rate limiting


def test_login_is_rate_limited_per_client(app, github, monkeypatch):
    monkeypatch.setitem(app.config, "LOGIN_RATE_LIMIT", 3)
    monkeypatch.setitem(app.config, "LOGIN_RATE_WINDOW_S", 3600)
    client = app.test_client()
    for _ in range(3):
        assert client.get("/login/github").status_code == 303
    limited = client.get("/login/github")
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 3600
    assert "Too many attempts" in limited.get_data(as_text=True)
    # The callback shares the limit; another address has its own.
    assert client.get("/login/github/callback?code=x&state=y").status_code == 429
    other = client.get("/login/github", environ_base={"REMOTE_ADDR": "192.0.2.7"})
    assert other.status_code == 303


def test_rate_limit_window_is_shared_and_resets(app):
    import time

    from app.extensions import db
    from app.ratelimit import TooManyAttempts, rate_limit
    with app.app_context():
        # Start just after a window boundary so the whole check fits in one window.
        time.sleep(1 - time.time() % 1 + 0.05)
        rate_limit("enroll:192.0.2.1", 2, 1)
        rate_limit("enroll:192.0.2.1", 2, 1)
        rate_limit("enroll:192.0.2.2", 2, 1)
        with pytest.raises(TooManyAttempts) as caught:
            rate_limit("enroll:192.0.2.1", 2, 1)
        assert caught.value.status == 429 and 0 < caught.value.retry_after_ms <= 1000
        assert caught.value.envelope()["error"]["code"] == "rate_limited"
        time.sleep(caught.value.retry_after_ms / 1000 + 0.05)
        rate_limit("enroll:192.0.2.1", 2, 1)
        db.session.remove()


def test_enrollment_limit_answers_the_api_envelope_and_pages_answer_html(app, monkeypatch):
    from app.ratelimit import TooManyAttempts, limit_enrollment
    monkeypatch.setitem(app.config, "ENROLL_RATE_LIMIT", 1)
    with app.test_request_context("/api/v1/fleet/register", method="POST",
                                  environ_base={"REMOTE_ADDR": "198.51.100.4"}):
        limit_enrollment()
        with pytest.raises(TooManyAttempts) as caught:
            limit_enrollment()
        response = app.make_response(app.handle_user_exception(caught.value))
    assert response.status_code == 429 and int(response.headers["Retry-After"]) >= 1
    assert response.get_json()["error"]["code"] == "rate_limited"
    with app.test_request_context("/login/github"):
        page = app.make_response(app.handle_user_exception(caught.value))
    assert page.status_code == 429 and "Too many attempts" in page.get_data(as_text=True)


def test_savewebhq_oauth_paths_and_imported_user_ids(app, github):
    """An operator switching from SavewebHQ keeps the GitHub OAuth App's
    callback (/auth/github/callback), and a user imported as ``gh_<id>``
    signs in as that same user."""
    github.add_to_team("carol")
    number = github.sign_in_as("carol")
    set_status(app, f"gh_{number}", ["admin"], "active")
    app.config["GITHUB_CALLBACK_PATH"] = "/auth/github/callback"
    try:
        client = app.test_client()
        start = client.get("/auth/github/start")
        assert start.status_code == 303
        approved = requests.get(start.headers["Location"], allow_redirects=False, timeout=10)
        back = urlsplit(approved.headers["Location"])
        assert back.path == "/auth/github/callback"
        done = client.get(f"{back.path}?{back.query}")
        assert done.status_code == 303 and done.headers["Location"] == "/admin"
    finally:
        app.config["GITHUB_CALLBACK_PATH"] = "/login/github/callback"
    assert query(app, "SELECT id, github_login FROM users WHERE id LIKE 'gh%'") == [
        (f"gh_{number}", "carol")]
