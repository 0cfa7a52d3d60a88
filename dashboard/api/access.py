"""Who may call what in the JSON API, decided before the request is parsed or validated
(the session's CSRF check too: SessionAuthentication).

Reads need the viewer role; anything else the operator role, and a refusal is written to
the audit log under the view's ``audit_action`` (dashboard.actions.ACTIONS).  So a viewer's
forged request, well-formed or not, is always a 403 and always audited; the action code
checks the role again (one rule, enforced twice)."""
from __future__ import annotations

from django.http import QueryDict
from django.utils.datastructures import MultiValueDict
from rest_framework.authentication import SessionAuthentication as DrfSessionAuthentication
from rest_framework.permissions import SAFE_METHODS, BasePermission

from dashboard.actions.audit import OPERATORS_ONLY, record_denial
from dashboard.security.permissions import CanView, can_act, can_view


class ViewOrAct(BasePermission):
    message = CanView.message

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            self.message = CanView.message
            return can_view(request.user)
        if can_act(request.user):
            return True
        self.message = OPERATORS_ONLY
        record_denial(request.user, getattr(view, "audit_action", "api_request"), "api", target=request.path)
        return False


class SessionAuthentication(DrfSessionAuthentication):
    """DRF's session scheme with its CSRF check made on Django's request.  DRF hands the
    check its own Request, whose ``.POST`` parses the body: a malformed body was answered
    (400 "malformed JSON", or a 500 for ``[`` × 100,000) before the CSRF token and the role
    were looked at, and a viewer's refusal went unaudited.  On Django's request the token is
    read from the X-CSRFToken header, no body is parsed, and the check comes first."""

    def enforce_csrf(self, request) -> None:
        django_request = getattr(request, "_request", request)
        if not hasattr(django_request, "_post"):
            # The API's token comes in X-CSRFToken (its bodies are JSON, and a form body is
            # refused later with a 415): Django must not parse a form body for one either,
            # or a multipart body without a boundary would be a 500 here.
            django_request._post, django_request._files = QueryDict(), MultiValueDict()
        super().enforce_csrf(django_request)
