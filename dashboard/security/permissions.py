"""Roles: who may look at the dashboard and who may act on messages.

Two Django groups, created by a data migration (dashboard/migrations/0002_roles.py):

- ``sluice-viewer`` sees every page and every read endpoint of the JSON API;
- ``sluice-operator`` also acts: delete, purge, move, retry, archive, restore, edit,
  deliver now, dispatch, run the analytics pipeline.

Superusers are operators.  A user in neither group (and not a superuser) sees nothing:
403 once logged in.  The server always enforces these rules, whatever the page shows.

For pages: :func:`viewer_required` / :func:`operator_required` (function views) and
:class:`ViewerRequiredMixin` / :class:`OperatorRequiredMixin` (class-based views).
Anonymous users are sent to the login page; a logged-in user without the role gets
403 (never a redirect to a login they already passed).

For the JSON API (Django REST framework): :class:`SluiceRolePermission` (reads need
the viewer role, unsafe methods the operator role), :class:`CanView`, :class:`CanAct`.
"""
from __future__ import annotations

from functools import wraps
from typing import Any, Callable

from django.contrib.auth.mixins import AccessMixin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import reverse, reverse_lazy
from rest_framework.permissions import SAFE_METHODS, BasePermission

from dashboard.security.roles import (  # noqa: F401 — the roles, for the pages and the API
    OPERATOR_GROUP, ROLES, VIEWER_GROUP, can_act, can_view, forget_role, role_of)


def to_login(request: HttpRequest) -> HttpResponse:
    """To the dashboard's own login page (under whatever prefix the project mounted the
    dashboard: no ``LOGIN_URL`` setting needed), then back here."""
    return redirect_to_login(request.get_full_path(), login_url=reverse("dashboard:login"))


def _guard(check: Callable[[Any], bool], message: str) -> Callable:
    def decorator(view: Callable) -> Callable:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any):
            if not request.user.is_authenticated:
                return to_login(request)
            if not check(request.user):
                raise PermissionDenied(message)
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


#: Function views that show data: login required, then the viewer role (else 403).
viewer_required = _guard(can_view, "Your account has no Sluice role; ask an operator for sluice-viewer.")
#: Function views that act: login required, then the operator role (else 403).
operator_required = _guard(can_act, "Only operators (group sluice-operator) may do this.")


class _RoleMixin(AccessMixin):
    check: Callable[[Any], bool] = staticmethod(can_view)
    permission_denied_message = ""
    login_url = reverse_lazy("dashboard:login")

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any):
        if not request.user.is_authenticated:
            return self.handle_no_permission()  # → the login page
        if not type(self).check(request.user):
            raise PermissionDenied(self.get_permission_denied_message())
        return super().dispatch(request, *args, **kwargs)


class ViewerRequiredMixin(_RoleMixin):
    """Class-based views that show data."""

    check = staticmethod(can_view)
    permission_denied_message = "Your account has no Sluice role; ask an operator for sluice-viewer."


class OperatorRequiredMixin(_RoleMixin):
    """Class-based views that act."""

    check = staticmethod(can_act)
    permission_denied_message = "Only operators (group sluice-operator) may do this."


# -- Django REST framework -----------------------------------------------------------------


class CanView(BasePermission):
    message = "Your account has no Sluice role (sluice-viewer or sluice-operator)."

    def has_permission(self, request, view) -> bool:
        return can_view(request.user)


class CanAct(BasePermission):
    message = "Only operators (group sluice-operator) may do this."

    def has_permission(self, request, view) -> bool:
        return can_act(request.user)


class SluiceRolePermission(BasePermission):
    """The API's default: GET/HEAD/OPTIONS need the viewer role, everything else the
    operator role.  (The action code checks again: one rule, enforced twice.)"""

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            self.message = CanView.message
            return can_view(request.user)
        self.message = CanAct.message
        return can_act(request.user)
