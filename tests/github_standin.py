"""A local stand-in for GitHub's OAuth and REST endpoints, over real HTTP.

It runs a small Flask app on a free loopback port in a thread and speaks the
parts of GitHub that sign-in uses:

- ``GET /login/oauth/authorize`` auto-approves: checks client_id,
  redirect_uri, scope and the PKCE challenge (S256), then redirects back with
  ``code`` and ``state``;
- ``POST /login/oauth/access_token`` checks the code (once only), the client
  secret, the redirect_uri and the PKCE verifier against the challenge; it
  answers JSON, and like GitHub it answers errors with 200 and ``{"error"}``;
- ``GET /user`` by bearer token;
- ``GET /orgs/<org>/teams/<team>/memberships/<login>``: 200 ``{"state":
  "active"}`` for members, 404 otherwise (also what GitHub says to tokens
  without ``read:org``).

The app under test is pointed here through its ordinary settings
(``standin.settings()``). Tests choose who signs in next with
``sign_in_as(login)`` and manage the team with ``add_to_team`` /
``remove_from_team``.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
from urllib.parse import urlencode

from flask import Flask, jsonify, redirect, request
from werkzeug.serving import make_server

CLIENT_ID = "standin-client-id"
CLIENT_SECRET = "standin-client-secret"
ORG = "fleet-org"
TEAM = "hq-admins"


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class GitHubStandIn:
    def __init__(self):
        self.users: dict[str, int] = {}          # login -> numeric id
        self.team: set[str] = set()
        self.next_login: str | None = None
        self.codes: dict[str, dict] = {}
        self.tokens: dict[str, dict] = {}        # access token -> {login, scope}
        self.log: list[tuple[str, str]] = []     # (method, path) of every request
        self.authorize_params: list[dict] = []
        self.token_requests: list[dict] = []
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._app(), threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # ------------------------------------------------------------ control

    def start(self) -> "GitHubStandIn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()

    def settings(self) -> dict:
        """The app settings that send sign-in here instead of github.com."""
        return {"GITHUB_CLIENT_ID": CLIENT_ID, "GITHUB_CLIENT_SECRET": CLIENT_SECRET,
                "GITHUB_AUTHORIZE_URL": f"{self.url}/login/oauth/authorize",
                "GITHUB_TOKEN_URL": f"{self.url}/login/oauth/access_token",
                "GITHUB_API_URL": self.url, "GITHUB_ORG": ORG, "GITHUB_ADMIN_TEAM": TEAM}

    def reset(self) -> None:
        """Forget the team and the next sign-in (users and their ids stay)."""
        with self._lock:
            self.team.clear()
            self.next_login = None

    def sign_in_as(self, login: str) -> int:
        """The next authorization approves as ``login``; returns their GitHub id."""
        with self._lock:
            self.next_login = login
            return self.users.setdefault(login, 1000 + len(self.users))

    def user_id(self, login: str) -> str:
        """The FleetHQ user id that ``login`` maps to."""
        return f"gh-{self.users[login]}"

    def add_to_team(self, login: str) -> None:
        self.team.add(login)

    def remove_from_team(self, login: str) -> None:
        self.team.discard(login)

    # ------------------------------------------------------------ endpoints

    def _app(self) -> Flask:
        app = Flask("github_standin")

        @app.before_request
        def _log():
            self.log.append((request.method, request.path))

        @app.get("/login/oauth/authorize")
        def authorize():
            args = request.args
            self.authorize_params.append(dict(args))
            if args.get("client_id") != CLIENT_ID:
                return "unknown client_id", 400
            if not args.get("redirect_uri", "").startswith(("http://", "https://")):
                return "redirect_uri missing", 400
            if not args.get("code_challenge") or args.get("code_challenge_method") != "S256":
                return "PKCE S256 challenge required", 400
            if args.get("response_type") != "code" or not args.get("state"):
                return "response_type=code and state required", 400
            with self._lock:
                login, self.next_login = self.next_login, None
            if login is None:
                return "no user set up to sign in (call sign_in_as)", 409
            code = secrets.token_hex(10)
            self.codes[code] = {"login": login, "redirect_uri": args["redirect_uri"],
                                "challenge": args["code_challenge"],
                                "scope": args.get("scope", "")}
            sep = "&" if "?" in args["redirect_uri"] else "?"
            return redirect(args["redirect_uri"] + sep + urlencode({"code": code,
                                                                     "state": args["state"]}))

        @app.post("/login/oauth/access_token")
        def access_token():
            form = request.form
            self.token_requests.append(dict(form))
            client_id, secret = form.get("client_id"), form.get("client_secret")
            if request.authorization:  # client_secret_basic is accepted by GitHub as well
                client_id, secret = request.authorization.username, request.authorization.password
            if client_id != CLIENT_ID or not hmac.compare_digest(secret or "", CLIENT_SECRET):
                return jsonify(error="incorrect_client_credentials")
            grant = self.codes.pop(form.get("code", ""), None)
            if grant is None or form.get("redirect_uri") != grant["redirect_uri"]:
                return jsonify(error="bad_verification_code")
            if not hmac.compare_digest(s256(form.get("code_verifier", "")), grant["challenge"]):
                return jsonify(error="bad_verification_code",
                               error_description="PKCE verification failed")
            token = "gho_" + secrets.token_hex(16)
            self.tokens[token] = {"login": grant["login"], "scope": grant["scope"]}
            return jsonify(access_token=token, token_type="bearer", scope=grant["scope"])

        def _caller():
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() not in ("bearer", "token"):
                return None
            return self.tokens.get(token.strip())

        @app.get("/user")
        def user():
            who = _caller()
            if who is None:
                return jsonify(message="Requires authentication"), 401
            login = who["login"]
            return jsonify(login=login, id=self.users[login], type="User", name=login.title())

        @app.get("/orgs/<org>/teams/<team>/memberships/<login>")
        def membership(org, team, login):
            who = _caller()
            if who is None:
                return jsonify(message="Requires authentication"), 401
            if "read:org" not in who["scope"].split() or (org, team) != (ORG, TEAM) \
                    or login not in self.team:
                return jsonify(message="Not Found"), 404
            return jsonify(state="active", role="member", url=request.url)

        return app
