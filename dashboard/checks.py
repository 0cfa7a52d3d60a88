"""System checks of what a project must give the dashboard, each message with its exact fix.

Adding Sluice's apps and ``include("dashboard.urls")`` is all a project must do; these say
what else is missing where a project has changed Django's defaults (``startproject``'s
settings pass every error here), and what it gains by adding the optional pieces.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

#: Apps the dashboard cannot work without, and why.
REQUIRED_APPS = {
    "core": "Sluice's engine (app label 'sluice')",
    "django.contrib.auth": "logins and roles",
    "django.contrib.contenttypes": "what django.contrib.auth needs",
    "django.contrib.sessions": "the dashboard's logins",
    "django.contrib.messages": "the pages' notices after an action",
    "django.contrib.staticfiles": "the dashboard's CSS and scripts",
    "django_htmx": "the htmx script the pages load",
}
#: Middleware the dashboard cannot work without.
REQUIRED_MIDDLEWARE = {
    "django.contrib.sessions.middleware.SessionMiddleware": "logins",
    "django.middleware.csrf.CsrfViewMiddleware": "CSRF protection of every action",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "logins",
    "django.contrib.messages.middleware.MessageMiddleware": "the pages' notices",
}
#: Middleware that protects the dashboard; each bounds only the dashboard's own paths.
RECOMMENDED_MIDDLEWARE = {
    "dashboard.timeouts.StatementTimeoutMiddleware":
        "every dashboard read bounded by SLUICE_DASHBOARD_STATEMENT_TIMEOUT (a 503, not a stuck worker)",
    "dashboard.security.middleware.security_headers": "the Permissions-Policy header",
    "dashboard.security.middleware.api_query_without_nul": "a 400 for NUL characters in API queries",
}
AXES_BACKEND = "axes.backends.AxesStandaloneBackend"
OIDC_BACKEND = "dashboard.security.oidc.SluiceOIDCBackend"
AXES_MIDDLEWARE = "axes.middleware.AxesMiddleware"


# Tagged "dashboard": the dashboard's serving set-up, which `sluice worker` does not check
# (core/management/commands/sluice.py: the single sign-on part loads an HTTP client).
@checks.register("dashboard")
def sluice_project(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Apps, middleware and templates a project must have for the dashboard."""
    problems: list[checks.CheckMessage] = []
    installed = set(settings.INSTALLED_APPS)
    for app, why in REQUIRED_APPS.items():
        if app not in installed and not any(entry.startswith(app + ".apps.") for entry in installed):
            problems.append(checks.Error(f"Sluice's dashboard needs the app {app!r} ({why})",
                                         hint=f'add "{app}" to INSTALLED_APPS', id="sluice.E011"))
    middleware = list(settings.MIDDLEWARE)
    for entry, why in REQUIRED_MIDDLEWARE.items():
        if entry not in middleware:
            problems.append(checks.Error(f"Sluice's dashboard needs the middleware {entry!r} ({why})",
                                         hint=f'add "{entry}" to MIDDLEWARE (startproject has it)', id="sluice.E012"))
    if not any(_finds_app_templates(engine) for engine in settings.TEMPLATES):
        problems.append(checks.Error(
            "Sluice's dashboard finds its templates through its app, and no DjangoTemplates engine "
            "looks in apps", hint='set "APP_DIRS": True in the DjangoTemplates entry of TEMPLATES',
            id="sluice.E013"))
    for entry, why in RECOMMENDED_MIDDLEWARE.items():
        if entry not in middleware:
            problems.append(checks.Warning(f"without {entry!r}: no {why}",
                                           hint=f'add "{entry}" to MIDDLEWARE', id="sluice.W010"))
    if "axes" not in installed or AXES_MIDDLEWARE not in middleware or \
            AXES_BACKEND not in getattr(settings, "AUTHENTICATION_BACKENDS", ()):
        problems.append(checks.Warning(
            "the dashboard's login has no lock-out after repeated failures (django-axes is not set up)",
            hint=f'add "axes" to INSTALLED_APPS, "{AXES_BACKEND}" first in AUTHENTICATION_BACKENDS and '
                 f'"{AXES_MIDDLEWARE}" last in MIDDLEWARE', id="sluice.W011"))
    return problems + _single_sign_on()


def _single_sign_on() -> list[checks.CheckMessage]:
    """SLUICE_OIDC_* half set, or set without the backend that uses them (sluice.E014)."""
    from dashboard.security.oidc import configuration_problems, sso_enabled

    try:
        problems = configuration_problems()
    except ValueError:  # a SLUICE_* value refused: sluice.E002 names it
        return []
    found = [checks.Error(problem, hint="docs/operations/single-sign-on.md lists the settings", id="sluice.E014")
             for problem in problems]
    if sso_enabled() and OIDC_BACKEND not in getattr(settings, "AUTHENTICATION_BACKENDS", ()):
        found.append(checks.Error("SLUICE_OIDC_ISSUER is set but no backend logs its users in",
                                  hint=f'add "{OIDC_BACKEND}" to AUTHENTICATION_BACKENDS', id="sluice.E014"))
    return found


def _finds_app_templates(engine: dict[str, Any]) -> bool:
    if engine.get("BACKEND") != "django.template.backends.django.DjangoTemplates":
        return False
    if engine.get("APP_DIRS"):
        return True
    loaders = (engine.get("OPTIONS") or {}).get("loaders") or ()
    return "django.template.loaders.app_directories.Loader" in str(loaders)
