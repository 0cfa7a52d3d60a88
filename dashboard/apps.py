from __future__ import annotations

import importlib.util
from pathlib import Path

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


def foreign_core() -> str | None:
    """Where the ``core`` package Python finds lives, if it is not Sluice's engine.

    Sluice installs top-level packages named ``core``, ``dashboard`` and ``workers``; a host
    project with a ``core`` package of its own shadows the engine (the project's directory
    comes first on ``sys.path``), and every import of the engine would then fail with a
    confusing ModuleNotFoundError.  Sluice's ``core`` sits beside this package."""
    spec = importlib.util.find_spec("core")
    ours = Path(__file__).resolve().parent.parent
    if spec is None or spec.origin is None:
        return None  # no core at all: the missing-app check says what to add
    found = Path(spec.origin).resolve().parent
    return None if found.parent == ours and (found / "transport" / "__init__.py").is_file() else str(found)


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Sluice dashboard"

    def __init__(self, app_name: str, app_module: object) -> None:
        shadow = foreign_core()
        if shadow is not None:
            # Before any model or URL of ours imports the engine: one clear message.
            raise ImproperlyConfigured(
                f"sluice.E010: the package 'core' at {shadow} is not Sluice's engine. Sluice installs a "
                f"top-level package named 'core' (its engine, app label 'sluice'); your project has one of "
                f"its own that shadows it. Rename your project's 'core' package (and its entry in "
                f"INSTALLED_APPS), or run Sluice in a project without one.")
        super().__init__(app_name, app_module)

    def ready(self) -> None:
        # Registers the system checks of the project's settings (dashboard/checks.py).  Here,
        # not at the top: they read the engine's settings, and this module must load (and
        # say what is wrong) even when the engine cannot.
        from dashboard import checks  # noqa: F401
        # The command line's pauses and resumes are audited like the pages' (the engine
        # announces them with a signal: it does not import the dashboard).
        from core.runtime.pauses import pause_changed
        from dashboard.security.audit_log import audit_cli_pause
        pause_changed.connect(audit_cli_pause, dispatch_uid="sluice-audit-cli-pause")
        from core.runtime.limits import limits_changed
        from dashboard.security.audit_log import audit_cli_limits
        limits_changed.connect(audit_cli_limits, dispatch_uid="sluice-audit-cli-limits")
