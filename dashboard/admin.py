"""The audit trail and API tokens in the Django admin, read-only; users with their role and
active-state changes audited."""
from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from core.admin import ReadOnlyAdmin
from dashboard.security.audit_log import Audit
from dashboard.models import ApiToken, AuditEntry, AuditOutcome
from dashboard.security.roles import role_of


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "username", "action", "target", "outcome", "via")
    list_filter = ("action", "outcome", "via")
    search_fields = ("username", "target")
    date_hierarchy = "at"


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Which tokens exist and whose they are; never the digest (keys are shown only once,
    by ``sluice user token``)."""

    list_display = ("prefix", "user", "created", "expires", "revoked_at")
    fields = list_display
    list_filter = ("revoked_at",)
    search_fields = ("user__username", "prefix")


def _account_state(pk: int) -> tuple[str | None, bool]:
    """(Sluice role, active) of a user as stored now (a fresh object: no cached role)."""
    user = get_user_model().objects.get(pk=pk)
    return role_of(user), user.is_active


class AuditedUserAdmin(UserAdmin):
    """Django's user admin, with role and active-state changes written to the audit log
    (via "admin"), as `sluice user` writes its own (via "cli")."""

    def save_model(self, request, obj, form, change) -> None:
        request._sluice_account_before = _account_state(obj.pk) if change and obj.pk else (None, False)
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change) -> None:
        super().save_related(request, form, formsets, change)  # the groups are saved here
        (role, active), (new_role, new_active) = request._sluice_account_before, _account_state(form.instance.pk)
        if (role, active) == (new_role, new_active):
            return
        action = "disable_user" if active and not new_active else "set_role"
        Audit(user=request.user, action=action, via="admin", target=f"user {form.instance.username}",
              ids=[str(form.instance.pk)]).write(
            AuditOutcome.OK, f"role {role or 'none'} → {new_role or 'none'}, "
                             f"{'active' if new_active else 'inactive'}{'' if change else ' (created)'}")


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), AuditedUserAdmin)
