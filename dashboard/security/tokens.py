"""API tokens: issued by ``sluice user token``, hashed at rest, expiring, revocable.

A request authenticates with ``Authorization: Token <key>`` (the header DRF's own token
scheme used, so existing scripts keep working); the key's SHA-256 is looked up, and a
token that expired, was revoked or belongs to an inactive user is refused with 401.
"""
from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.throttling import SimpleRateThrottle

from core.conf import get_settings
from dashboard.models import ApiToken
from dashboard.security.token_keys import digest_of, issue, live, revoke  # noqa: F401 — tokens.issue & co.


def client_address(request: Any) -> str:
    """The address a throttle counts against: the connection's own (``REMOTE_ADDR``), never a
    header the client sends (``X-Forwarded-For`` would make every guess a new identity).  The
    login lock-out (django-axes) reads the same by default.  Behind a reverse proxy every
    client shares the proxy's address: a stricter limit, never a weaker one."""
    return request.META.get("REMOTE_ADDR") or "unknown"


class FailedTokenThrottle(SimpleRateThrottle):
    """Wrong tokens per client address, at the anonymous rate (``SLUICE_API_RATE_ANON``).
    DRF's own throttles run only after authentication succeeded, so they never see a guess."""

    scope = "sluice-token-failures"

    def get_rate(self) -> str:
        return get_settings().API_RATE_ANON

    def get_ident(self, request: Any) -> str:
        return client_address(request)

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": "token-failures", "ident": self.get_ident(request)}

    def exhausted(self, request) -> bool:
        history = [t for t in self.cache.get(self.get_cache_key(request, None), [])
                   if t > self.timer() - self.duration]
        return len(history) >= self.num_requests


class HashedTokenAuthentication(TokenAuthentication):
    """DRF's ``Token <key>`` header, checked against :class:`ApiToken` digests.  An address
    that sent too many wrong tokens gets 429 before its next token is even looked at."""

    def authenticate(self, request):
        if not request.META.get("HTTP_AUTHORIZATION"):
            return None
        throttle = FailedTokenThrottle()
        if throttle.exhausted(request):
            raise exceptions.Throttled(throttle.duration)
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            throttle.allow_request(request, None)  # counts this failure
            raise

    def authenticate_credentials(self, key: str):
        token = (ApiToken.objects.select_related("user")
                 .filter(digest=digest_of(key), revoked_at__isnull=True).first())
        if token is None or token.expires <= timezone.now():
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        return token.user, token
