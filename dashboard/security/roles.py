"""Roles: who may look at the dashboard and who may act (dashboard.security.permissions
says how pages and the API enforce them).  No web framework here: the admin, the audit log
and the command line ask these too, in processes that serve no page (a worker)."""
from __future__ import annotations

from typing import Any

VIEWER_GROUP = "sluice-viewer"
OPERATOR_GROUP = "sluice-operator"
#: ``sluice user add --role`` names → group names.
ROLES: dict[str, str] = {"viewer": VIEWER_GROUP, "operator": OPERATOR_GROUP}

#: Cached on the user object for the request (a page asks several times).
_CACHE_ATTR = "_sluice_role"


def role_of(user: Any) -> str | None:
    """"operator", "viewer" or None (anonymous, inactive, or in no Sluice group)."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
        return None
    if getattr(user, "is_superuser", False):
        return "operator"
    cached = getattr(user, _CACHE_ATTR, "")
    if cached != "":
        return cached
    names = set(user.groups.filter(name__in=ROLES.values()).values_list("name", flat=True))
    role = "operator" if OPERATOR_GROUP in names else ("viewer" if VIEWER_GROUP in names else None)
    try:
        setattr(user, _CACHE_ATTR, role)
    except AttributeError:  # a user object that refuses attributes: just do not cache
        pass
    return role


def can_view(user: Any) -> bool:
    """May see every page and read endpoint (viewers, operators, superusers)."""
    return role_of(user) is not None


def can_act(user: Any) -> bool:
    """May perform operator actions (operators and superusers)."""
    return role_of(user) == "operator"


def forget_role(user: Any) -> None:
    """Drop the cached role (after changing the user's groups in the same request)."""
    if hasattr(user, _CACHE_ATTR):
        delattr(user, _CACHE_ATTR)
