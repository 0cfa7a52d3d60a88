"""The class every JSON API view derives from: it names its own authentication, permission,
throttle, parser, renderer, schema and error handling, so the API behaves the same in any host
project whatever that project's ``REST_FRAMEWORK`` says (an API left to the host's defaults
would answer anonymous callers).

- Token first, then the session (its CSRF check made on Django's own request, before the
  body is parsed): a request without credentials gets 401 with ``WWW-Authenticate: Token``
  (with the session scheme first it would be a 403, like a missing role).
- Reads need a Sluice role, anything else the operator role, checked before the body is
  parsed (:class:`~dashboard.api.access.ViewOrAct`).
- Throttles at ``SLUICE_API_RATE_ANON`` per client address and ``SLUICE_API_RATE_USER`` per
  user.  The address is the connection's own (``REMOTE_ADDR``): a client-sent
  ``X-Forwarded-For`` never makes a new identity (behind a proxy, the proxy sets
  ``REMOTE_ADDR`` through the WSGI server's own trusted-proxy handling).
- JSON in and out (JSON nested past what any request needs is a 400, not a 500); every error
  as ``{"error": ...}`` (:mod:`dashboard.api.errors`).
"""
from __future__ import annotations

from typing import Any, Callable

from drf_spectacular.authentication import SessionScheme
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle
from rest_framework.views import APIView

from core.conf import get_settings

from dashboard.api.access import SessionAuthentication, ViewOrAct
from dashboard.api.errors import exception_handler
from dashboard.api.params import JSONParser
from dashboard.security.permissions import CanView
from dashboard.security.tokens import HashedTokenAuthentication, client_address


class CsrfFirstSessionScheme(SessionScheme):
    """The OpenAPI description of our session scheme: DRF's cookie login (drf-spectacular
    describes DRF's own class only, not a subclass of it)."""

    target_class = "dashboard.api.access.SessionAuthentication"


class AnonThrottle(AnonRateThrottle):
    """Anonymous callers per address, at ``SLUICE_API_RATE_ANON``."""

    scope = "sluice-anon"

    def get_rate(self) -> str:
        return get_settings().API_RATE_ANON

    def get_ident(self, request: Request) -> str:
        return client_address(request)


class UserThrottle(UserRateThrottle):
    """Logged-in callers per user, at ``SLUICE_API_RATE_USER``."""

    scope = "sluice-user"

    def get_rate(self) -> str:
        return get_settings().API_RATE_USER

    def get_ident(self, request: Request) -> str:
        return client_address(request)


class SluiceAPIView(APIView):
    authentication_classes = [HashedTokenAuthentication, SessionAuthentication]
    permission_classes = [ViewOrAct]
    throttle_classes = [AnonThrottle, UserThrottle]
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]
    schema = AutoSchema()

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Any]:
        return exception_handler


class SchemaView(SpectacularAPIView):
    """``/api/schema/``: the OpenAPI document, for logged-in users with a Sluice role, titled
    here (no ``SPECTACULAR_SETTINGS`` needed), and not listed in itself."""

    authentication_classes = SluiceAPIView.authentication_classes
    permission_classes = [CanView]
    throttle_classes = SluiceAPIView.throttle_classes
    schema = None  # not an endpoint of the document it serves
    custom_settings = {"TITLE": "Sluice API", "VERSION": "1"}

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Any]:
        return exception_handler
