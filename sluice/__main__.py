"""The ``sluice`` command (and ``python -m sluice``): Sluice's command line without a manage.py.

- ``sluice --version``: the installed version.
- ``sluice manage ARGS``: any Django management command (``sluice manage migrate``,
  ``sluice manage collectstatic``, ``sluice manage check --deploy``).
- ``sluice ARGS``: one of Sluice's own sub-commands, as ``manage.py sluice ARGS``
  (``sluice setup``, ``sluice status --check``, ``sluice send ...``).

Settings come from ``--settings`` or ``DJANGO_SETTINGS_MODULE``, else from the ``manage.py``
in the current directory (your project), else Sluice's bundled project ``sluice.settings``,
which reads the environment (DATABASE_URL, REDIS_URL, SLUICE_*): :mod:`sluice.project`.
"""
from __future__ import annotations

import sys

from sluice import __version__
from sluice.project import ProjectNotFound, use_project


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        print(__version__)
        return
    try:
        use_project(args)
    except ProjectNotFound as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from django.core.management import execute_from_command_line

    # Django's usage lines name argv[0]: "sluice".
    if args[:1] == ["manage"]:
        execute_from_command_line(["sluice", *args[1:]])
    else:
        execute_from_command_line(["sluice", "sluice", *args])


if __name__ == "__main__":
    main()
