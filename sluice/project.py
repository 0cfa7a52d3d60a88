"""Which Django project the ``sluice`` command and the Celery app run in.

A host project's settings, not Sluice's bundled demo project, whenever there is one:

1. ``DJANGO_SETTINGS_MODULE`` (or the command's ``--settings``), as Django itself reads it;
2. else the settings module the ``manage.py`` in the current directory names (the project
   you stand in, as ``python manage.py`` would run it);
3. else the bundled project, ``sluice.settings`` (configured by environment variables).

The current directory goes on ``sys.path`` first, as it does for ``manage.py``, so the
project's packages import when ``sluice`` runs from an installed script.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

BUNDLED = "sluice.settings"
#: ``os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")`` in a manage.py.
_MANAGE_PY_SETTING = re.compile(r"""setdefault\(\s*["']DJANGO_SETTINGS_MODULE["']\s*,\s*["']([\w.]+)["']""")


class ProjectNotFound(Exception):
    """The settings module chosen cannot be imported; the message says which and why."""


def settings_module(argv: list[str] | None = None, cwd: Path | None = None) -> tuple[str, str]:
    """The settings module to use, and where that choice came from (for messages)."""
    for i, arg in enumerate(argv or []):
        if arg.startswith("--settings="):
            return arg.split("=", 1)[1], "--settings"
        if arg == "--settings" and i + 1 < len(argv or []):
            return (argv or [])[i + 1], "--settings"
    if os.environ.get("DJANGO_SETTINGS_MODULE"):
        return os.environ["DJANGO_SETTINGS_MODULE"], "DJANGO_SETTINGS_MODULE"
    manage = (cwd or Path.cwd()) / "manage.py"
    if manage.is_file():
        found = _MANAGE_PY_SETTING.search(manage.read_text(errors="replace"))
        if found:
            return found.group(1), str(manage)
    return BUNDLED, "Sluice's bundled project (no DJANGO_SETTINGS_MODULE, no manage.py here)"


def use_project(argv: list[str] | None = None) -> tuple[str, str]:
    """Choose the settings module, put the current directory on ``sys.path`` and check the
    module imports: :class:`ProjectNotFound` with the reason if it does not."""
    module, source = settings_module(argv)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    os.environ["DJANGO_SETTINGS_MODULE"] = module
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ProjectNotFound(
            f"cannot import the settings module {module!r} (from {source}): {exc}. Run sluice from "
            f"your project's directory (where manage.py is), or put the project on PYTHONPATH.") from exc
    return module, source
