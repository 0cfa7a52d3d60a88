"""A small OpenID Connect provider on 127.0.0.1 for the single sign-on tests
(tests/test_sso.py, tests/test_browser_sso.py): discovery, JWKS (an RS256 key made here),
an authorization endpoint that approves at once (as whoever :attr:`OIDCProvider.user` says,
the way a provider with a live session does), the token endpoint (code, client secret,
redirect URI and PKCE checked, one use per code) and userinfo.

Its ID token carries ``sub`` and the nonce; the user's other claims (name, e-mail, groups)
come from userinfo, as many providers do.  ``audience`` makes it sign tokens for another
client, to see the dashboard refuse them."""
from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from dashboard.security.oidc import forget_provider

CLIENT_ID = "sluice-dashboard"
CLIENT_SECRET = "client-secret-for-tests"


class OIDCProvider:
    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(4)
        #: Claims of the user the next authorization approves (None: the user refuses).
        self.user: dict[str, Any] | None = None
        #: The ``aud`` of the ID tokens (None: the client's own id).
        self.audience: str | None = None
        self.codes: dict[str, dict[str, Any]] = {}
        self.tokens: dict[str, dict[str, Any]] = {}
        #: Every request, as "METHOD /path" (what the dashboard asked, in order).
        self.seen: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="oidc-provider", daemon=True)

    def __enter__(self) -> OIDCProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def log_in_as(self, username: str, groups: list[str] | str | None = None, **claims: Any) -> None:
        self.user = {"sub": f"sub-{username}", "preferred_username": username, "email": f"{username}@example.com",
                     **({"groups": groups} if groups is not None else {}), **claims}

    # -- the endpoints ------------------------------------------------------------------------

    def discovery(self) -> dict[str, Any]:
        return {"issuer": self.issuer, "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token", "userinfo_endpoint": f"{self.issuer}/userinfo",
                "jwks_uri": f"{self.issuer}/jwks", "response_types_supported": ["code"],
                "subject_types_supported": ["public"], "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"]}

    def jwks(self) -> dict[str, Any]:
        public = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def authorize(self, query: dict[str, str]) -> str:
        """Where the browser goes next: back to the client with a code (or an error)."""
        back = query["redirect_uri"]
        if query.get("client_id") != CLIENT_ID or query.get("response_type") != "code" or \
                query.get("code_challenge_method") != "S256" or "openid" not in query.get("scope", "").split():
            return _with(back, error="invalid_request", state=query.get("state", ""))
        if self.user is None:
            return _with(back, error="access_denied", state=query["state"])
        code = secrets.token_urlsafe(16)
        self.codes[code] = {"user": dict(self.user), "nonce": query.get("nonce"), "redirect_uri": back,
                            "challenge": query["code_challenge"]}
        return _with(back, code=code, state=query["state"])

    def token(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        grant = self.codes.pop(form.get("code", ""), None)
        if grant is None or form.get("grant_type") != "authorization_code":
            return 400, {"error": "invalid_grant"}
        if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
            return 401, {"error": "invalid_client"}
        verifier = form.get("code_verifier", "").encode()
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=").decode()
        if form.get("redirect_uri") != grant["redirect_uri"] or challenge != grant["challenge"]:
            return 400, {"error": "invalid_grant"}
        now = int(time.time())
        id_token = jwt.encode({"iss": self.issuer, "sub": grant["user"]["sub"], "aud": self.audience or CLIENT_ID,
                               "iat": now, "exp": now + 300, "nonce": grant["nonce"]},
                              self.key, algorithm="RS256", headers={"kid": self.kid})
        access = secrets.token_urlsafe(16)
        self.tokens[access] = grant["user"]
        return 200, {"access_token": access, "token_type": "Bearer", "expires_in": 300, "id_token": id_token}

    def userinfo(self, authorization: str) -> tuple[int, dict[str, Any]]:
        claims = self.tokens.get(authorization.removeprefix("Bearer "))
        return (200, claims) if claims else (401, {"error": "invalid_token"})


@pytest.fixture
def provider(settings):
    """A running provider, and the dashboard's settings pointing at it."""
    with OIDCProvider() as idp:
        settings.SLUICE_OIDC_ISSUER = idp.issuer
        settings.SLUICE_OIDC_CLIENT_ID = CLIENT_ID
        settings.SLUICE_OIDC_CLIENT_SECRET = CLIENT_SECRET
        try:
            yield idp
        finally:
            forget_provider()


def _with(url: str, **params: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{urllib.parse.urlencode(params)}"


def _handler(provider: OIDCProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: the test output is for failures
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            provider.seen.append(f"GET {url.path}")
            if url.path == "/.well-known/openid-configuration":
                self._json(200, provider.discovery())
            elif url.path == "/jwks":
                self._json(200, provider.jwks())
            elif url.path == "/authorize":
                self.send_response(302)
                self.send_header("Location", provider.authorize(dict(urllib.parse.parse_qsl(url.query))))
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif url.path == "/userinfo":
                self._json(*provider.userinfo(self.headers.get("Authorization", "")))
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:
            provider.seen.append(f"POST {self.path}")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            if self.path == "/token":
                self._json(*provider.token(dict(urllib.parse.parse_qsl(body))))
            else:
                self._json(404, {"error": "not_found"})

    return Handler
