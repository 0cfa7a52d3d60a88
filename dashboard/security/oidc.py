"""Single sign-on with OpenID Connect, through mozilla-django-oidc.

mozilla-django-oidc does the protocol (authorization code flow with PKCE, state and nonce,
the token request, the ID token's RS256 signature against the provider's JWKS, userinfo);
this module feeds it Sluice's settings (``SLUICE_OIDC_*``, read through core.conf like every
other) and the endpoints the provider publishes at ``<issuer>/.well-known/openid-configuration``
(fetched on first use and kept for an hour), and decides who the user is and what role they
get:

- the user name is the ``SLUICE_OIDC_USERNAME_CLAIM`` (``preferred_username``, else ``sub``);
  a new name makes a new user without a password.  A *local* account of the same name (one
  with a password) is never taken over: that login is refused.
- the role comes from ``SLUICE_OIDC_ROLE_CLAIM`` (``groups``) at every login, through
  ``SLUICE_OIDC_VIEWER_GROUPS`` / ``_OPERATOR_GROUPS`` / ``_ADMIN_GROUPS``: the user's Sluice
  group is set to match (dashboard.security.permissions), admins are also staff and
  superusers.  A claim that grants nothing still logs in: every page then answers 403 (a
  login loop would follow from refusing a user the provider has already let through).

:class:`LocalPasswordBackend` is Django's ModelBackend that stops answering passwords when
``SLUICE_LOCAL_LOGIN`` is off (the admin site's login included).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from core.conf import get_settings
from dashboard.security.roles import OPERATOR_GROUP, VIEWER_GROUP, forget_role

log = logging.getLogger("sluice.dashboard.sso")

#: Seconds the provider's published endpoints are kept before they are fetched again.
DISCOVERY_SECONDS = 3600.0
#: Seconds one request to the provider may take.
PROVIDER_TIMEOUT = 10.0
#: A role's rank: the highest one the claim grants wins.
RANKS = {"viewer": 1, "operator": 2, "admin": 3}


class ProviderUnavailable(Exception):
    """The identity provider's discovery document could not be read; the message says why."""


@dataclass(frozen=True)
class Provider:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str


_discovered: dict[str, tuple[float, Provider]] = {}
_lock = threading.Lock()


def sso_enabled() -> bool:
    """Single sign-on is on when an issuer is named (the system checks ask for the rest)."""
    return bool(get_settings().OIDC_ISSUER)


def provider() -> Provider:
    """The configured issuer's endpoints, from its discovery document (cached)."""
    issuer = get_settings().OIDC_ISSUER
    with _lock:
        cached = _discovered.get(issuer)
        if cached and time.monotonic() - cached[0] < DISCOVERY_SECONDS:
            return cached[1]
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=PROVIDER_TIMEOUT, verify=import_from_settings("OIDC_VERIFY_SSL", True))
        answer.raise_for_status()
        document = answer.json()
        found = Provider(**{name: document[name] for name in Provider.__dataclass_fields__})
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        raise ProviderUnavailable(f"cannot read {url}: {exc}") from exc
    # OpenID Connect Discovery 1.0 §4.3: the document's issuer is exactly the one asked.
    if found.issuer.rstrip("/") != issuer.rstrip("/"):
        raise ProviderUnavailable(f"{url} names the issuer {found.issuer!r}, not {issuer!r}")
    with _lock:
        _discovered[issuer] = (time.monotonic(), found)
    return found


def forget_provider() -> None:
    """Drop the cached discovery documents (tests; a provider that moved its endpoints)."""
    with _lock:
        _discovered.clear()


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's ``get_settings``: its OIDC_* names answered from Sluice's settings
    and the discovered endpoints; anything else (OIDC_VERIFY_SSL, OIDC_PROXY…) from the
    project's own Django settings, as the library reads them."""
    options = get_settings()
    endpoints = {"OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint", "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
                 "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint", "OIDC_OP_JWKS_ENDPOINT": "jwks_uri"}
    if attr in endpoints:
        return getattr(provider(), endpoints[attr])
    ours = {
        "OIDC_RP_CLIENT_ID": options.OIDC_CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": options.OIDC_CLIENT_SECRET,
        "OIDC_RP_SIGN_ALGO": "RS256",
        "OIDC_RP_SCOPES": options.OIDC_SCOPES,
        "OIDC_USE_PKCE": True,
        "OIDC_TIMEOUT": PROVIDER_TIMEOUT,
        # Namespaced: the dashboard is include()-d under any prefix.
        "OIDC_AUTHENTICATION_CALLBACK_URL": "dashboard:oidc-callback",
        "LOGIN_REDIRECT_URL": "dashboard:overview",
    }
    if attr in ours:
        return ours[attr]
    if attr == "LOGIN_REDIRECT_URL_FAILURE":
        return reverse("dashboard:login") + "?sso=failed"
    return import_from_settings(attr, *default)


def claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by name, or by a dotted path into nested objects (``realm_access.roles``)."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def role_from_claims(claims: dict[str, Any]) -> str | None:
    """"admin", "operator", "viewer" or None, from the role claim's values."""
    options = get_settings()
    raw = claim(claims, options.OIDC_ROLE_CLAIM)
    values = {raw} if isinstance(raw, str) else {str(v) for v in raw} if isinstance(raw, (list, tuple)) else set()
    granted = [role for role, groups in (("viewer", options.OIDC_VIEWER_GROUPS),
                                         ("operator", options.OIDC_OPERATOR_GROUPS),
                                         ("admin", options.OIDC_ADMIN_GROUPS)) if values & set(groups)]
    return max(granted, key=RANKS.__getitem__, default=None)


class SluiceOIDCBackend(OIDCAuthenticationBackend):
    """The authentication backend for single sign-on (``AUTHENTICATION_BACKENDS``)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds every backend at every authenticate() call, password logins included:
        # nothing here may ask the provider anything (see _configure).
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()

    def _configure(self) -> None:
        super().__init__()

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        if request is None or not sso_enabled() or "code" not in request.GET or "state" not in request.GET:
            return None
        self._configure()
        return super().authenticate(request, **kwargs)

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """The library checks the signature, expiry and nonce; this adds the issuer and the
        audience (a token the provider made for another client is refused)."""
        payload = super().verify_token(token, **kwargs)
        if kwargs.get("nonce") is None:  # a userinfo answer signed as a JWT, not the ID token
            return payload
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if payload.get("iss", "").rstrip("/") != provider().issuer.rstrip("/"):
            raise SuspiciousOperation(f"ID token from the issuer {payload.get('iss')!r}, not ours")
        if get_settings().OIDC_CLIENT_ID not in audiences:
            raise SuspiciousOperation(f"ID token for the audience {audience!r}, not this client")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The ID token's claims with userinfo's over them: some providers put groups in one only."""
        return {**payload, **super().get_userinfo(access_token, id_token, payload)}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(self.get_username(claims))

    def get_username(self, claims: dict[str, Any]) -> str:
        name = claim(claims, get_settings().OIDC_USERNAME_CLAIM) or claims.get("sub") or ""
        return str(name)[:150]

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        users = self.UserModel.objects.filter(**{self.UserModel.USERNAME_FIELD: self.get_username(claims)})
        local = [u for u in users if u.has_usable_password()]
        if local:
            raise SuspiciousOperation(f"{local[0].get_username()!r} is a local account (it has a password); "
                                      "single sign-on does not take it over")
        return users

    def create_user(self, claims: dict[str, Any]) -> Any:
        user = self.UserModel.objects.create_user(self.get_username(claims), email=claims.get("email") or "")
        return self.update_user(user, claims)

    @transaction.atomic
    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        """The role the claim grants now replaces whatever the user had (the provider decides)."""
        role = role_from_claims(claims)
        group = {"viewer": VIEWER_GROUP, "operator": OPERATOR_GROUP, "admin": OPERATOR_GROUP}.get(role or "")
        user.groups.remove(*Group.objects.filter(name__in=(VIEWER_GROUP, OPERATOR_GROUP)))
        if group:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
        user.is_staff = user.is_superuser = role == "admin"
        user.email = claims.get("email") or user.email
        user.save(update_fields=["is_staff", "is_superuser", "email"])
        forget_role(user)
        log.info("single sign-on: %s logged in as %s", user.get_username(), role or "no role (403 on every page)")
        return user


class LocalPasswordBackend(ModelBackend):
    """Django's ModelBackend, refusing every password while ``SLUICE_LOCAL_LOGIN`` is off."""

    def authenticate(self, request: Any, username: str | None = None, password: str | None = None,
                     **kwargs: Any) -> Any:
        if not get_settings().LOCAL_LOGIN:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def configuration_problems() -> list[str]:
    """What a half-made single sign-on set-up lacks (dashboard/checks.py reports each)."""
    options = get_settings()
    named = {"SLUICE_OIDC_ISSUER": options.OIDC_ISSUER, "SLUICE_OIDC_CLIENT_ID": options.OIDC_CLIENT_ID,
             "SLUICE_OIDC_CLIENT_SECRET": options.OIDC_CLIENT_SECRET}
    missing = [name for name, value in named.items() if not value]
    if len(missing) == len(named):
        return [] if options.LOCAL_LOGIN else [
            "SLUICE_LOCAL_LOGIN is off and no single sign-on is configured: nobody can log in"]
    return [f"single sign-on is half configured: {', '.join(missing)} unset"] if missing else []

