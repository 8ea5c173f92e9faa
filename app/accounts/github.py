"""GitHub sign-in behind a small interface.

``client()`` returns a :class:`GitHubClient` built from the current settings
(``GITHUB_CLIENT_ID``, ``GITHUB_CLIENT_SECRET``, ``GITHUB_AUTHORIZE_URL``,
``GITHUB_TOKEN_URL``, ``GITHUB_API_URL``, ``GITHUB_ORG``,
``GITHUB_ADMIN_TEAM``), or ``None`` when no client id/secret is configured
(the null case: the login page says sign-in is not configured). Settings are
read per request, so tests and GitHub Enterprise point the same client at
another host; the test stand-in (``tests/github_standin.py``) is a real HTTP
server, not a mock of this module.

The access token only lives in local variables of one callback request: it
is never stored, logged or put in the session.

Exceptions:

    GitHubError          the exchange or an API call failed (502 page)
    └── SignInRefused    GitHub answered with an OAuth error (e.g. the user
                         denied access, or the code was bad/expired)
"""
from __future__ import annotations

from dataclasses import dataclass

import requests
from flask import current_app

SCOPE = "read:org"
TIMEOUT_S = 10
API_HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}


class GitHubError(Exception):
    """GitHub could not be reached or answered something unusable."""


class SignInRefused(GitHubError):
    """GitHub refused the sign-in (OAuth error response)."""


@dataclass(frozen=True)
class Identity:
    """Who signed in. ``id`` is GitHub's numeric account id: logins can be
    renamed and later reused by someone else, the id cannot."""
    id: int
    login: str


@dataclass(frozen=True)
class Authorization:
    """The start of one sign-in: the URL to send the browser to, and the
    values the callback must see again (kept in the signed session)."""
    url: str
    state: str
    code_verifier: str


class GitHubClient:
    def __init__(self, *, client_id: str, client_secret: str, authorize_url: str, token_url: str,
                 api_url: str, org: str | None, team: str | None):
        self.client_id = client_id
        self.client_secret = client_secret
        self.authorize_url = authorize_url
        self.token_url = token_url
        self.api_url = api_url.rstrip("/")
        self.org = org
        self.team = team

    def _oauth(self, redirect_uri: str):
        # authlib (and the cryptography it loads, some 16 MB) is imported at
        # the first sign-in, not in every web worker that only serves machines.
        from authlib.integrations.requests_client import OAuth2Session
        # GitHub documents client_id/client_secret as form parameters of the
        # token request; PKCE S256 on top of the state (GitHub supports it).
        return OAuth2Session(self.client_id, self.client_secret, scope=SCOPE,
                             redirect_uri=redirect_uri, code_challenge_method="S256",
                             token_endpoint_auth_method="client_secret_post")

    def start(self, redirect_uri: str) -> Authorization:
        from authlib.common.security import generate_token
        verifier = generate_token(64)
        with self._oauth(redirect_uri) as oauth:
            url, state = oauth.create_authorization_url(self.authorize_url, code_verifier=verifier)
        return Authorization(url=url, state=state, code_verifier=verifier)

    def exchange(self, code: str, redirect_uri: str, code_verifier: str) -> str:
        """Trade the callback's code for an access token (returned, never kept)."""
        from authlib.integrations.base_client import OAuthError
        try:
            with self._oauth(redirect_uri) as oauth:
                token = oauth.fetch_token(self.token_url, code=code, code_verifier=code_verifier,
                                          timeout=TIMEOUT_S)
        except OAuthError as exc:
            # GitHub answers bad codes with 200 + {"error": ...}; authlib raises.
            raise SignInRefused(exc.error or "oauth error") from None
        except (requests.RequestException, ValueError) as exc:
            raise GitHubError(f"token exchange failed: {type(exc).__name__}") from None
        access_token = token.get("access_token")
        if not access_token:
            raise GitHubError("token response without access_token")
        return access_token

    def _get(self, access_token: str, path: str) -> requests.Response:
        try:
            return requests.get(self.api_url + path, timeout=TIMEOUT_S, allow_redirects=False,
                                headers={**API_HEADERS, "Authorization": f"Bearer {access_token}"})
        except requests.RequestException as exc:
            raise GitHubError(f"GitHub API unreachable: {type(exc).__name__}") from None

    def identity(self, access_token: str) -> Identity:
        response = self._get(access_token, "/user")
        if response.status_code != 200:
            raise GitHubError(f"GET /user answered {response.status_code}")
        try:
            data = response.json()
            return Identity(id=int(data["id"]), login=str(data["login"]))
        except (ValueError, KeyError, TypeError):
            raise GitHubError("GET /user answered an unexpected body") from None

    def is_admin(self, access_token: str, login: str) -> bool:
        """Active member of the configured org team. No team configured means
        nobody becomes admin through GitHub."""
        if not (self.org and self.team):
            return False
        response = self._get(access_token, f"/orgs/{_seg(self.org)}/teams/{_seg(self.team)}"
                                           f"/memberships/{_seg(login)}")
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            # Failing closed would silently demote every admin on a GitHub
            # hiccup; failing the sign-in keeps roles as they are.
            raise GitHubError(f"team membership answered {response.status_code}")
        try:
            return response.json().get("state") == "active"
        except (ValueError, AttributeError):
            raise GitHubError("team membership answered an unexpected body") from None


def _seg(value: str) -> str:
    return requests.utils.quote(value, safe="")


def client() -> GitHubClient | None:
    cfg = current_app.config
    if not (cfg.get("GITHUB_CLIENT_ID") and cfg.get("GITHUB_CLIENT_SECRET")):
        return None
    return GitHubClient(client_id=cfg["GITHUB_CLIENT_ID"], client_secret=cfg["GITHUB_CLIENT_SECRET"],
                        authorize_url=cfg["GITHUB_AUTHORIZE_URL"], token_url=cfg["GITHUB_TOKEN_URL"],
                        api_url=cfg["GITHUB_API_URL"], org=cfg.get("GITHUB_ORG"),
                        team=cfg.get("GITHUB_ADMIN_TEAM"))
