"""The ``sluice`` command (and ``python -m sluice``): Sluice's command line without a manage.py.

- ``sluice --version``: the installed version.
- ``sluice manage ARGS``: any Django management command (``sluice manage migrate``,
  ``sluice manage collectstatic``, ``sluice manage check --deploy``).
- ``sluice ARGS``: one of Sluice's own sub-commands, as ``manage.py sluice ARGS``
  (``sluice setup``, ``sluice status --check``, ``sluice send ...``).

Settings come from ``DJANGO_SETTINGS_MODULE`` (default ``sluice.settings``, which reads
the environment: DATABASE_URL, REDIS_URL, SLUICE_*).
"""
from __future__ import annotations

import os
import sys

from sluice import __version__


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        print(__version__)
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sluice.settings")
    from django.core.management import execute_from_command_line

    # Django's usage lines name argv[0]: "sluice".
    if args[:1] == ["manage"]:
        execute_from_command_line(["sluice", *args[1:]])
    else:
        execute_from_command_line(["sluice", "sluice", *args])


if __name__ == "__main__":
    main()
