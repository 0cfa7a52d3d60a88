"""`python manage.py sluice …` — Sluice's command line.  Thin: parse, call core, print.

The sub-commands live in groups (core/cli/*.py for the engine's); every installed app
may add its own in ``<app>/sluice_cli.py``.  `python manage.py sluice --help` lists
them; the README's "Command line" section documents them and their stable --json formats.
"""
from __future__ import annotations

from django.core import checks
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils.module_loading import autodiscover_modules

from core import __version__
from core.cli.base import groups
from core.errors import SluiceError


#: The system checks of the web side (the admin's load every template library, the URL
#: checks every view, the dashboard's its single sign-on client): `sluice worker` serves
#: queues and skips them, which keeps the API, DRF, drf-spectacular and an HTTP client out
#: of a worker's memory.  Every other command runs all checks.
WEB_CHECK_TAGS = {checks.Tags.admin, checks.Tags.staticfiles, checks.Tags.templates, checks.Tags.urls, "dashboard"}


class Command(BaseCommand):
    help = "Sluice: SQL-table messaging (queues, sending, browsing, workers)."
    # Run in handle(), where the sub-command is known (WEB_CHECK_TAGS).
    requires_system_checks: list[str] = []

    def get_version(self) -> str:
        # `manage.py sluice --version`: Sluice's version, not Django's.
        return __version__

    def add_arguments(self, parser) -> None:
        # Run as the `sluice` command (sluice/__main__.py), this command is the program
        # itself: usage lines say "sluice setup", not "sluice sluice setup".
        if parser.prog == "sluice sluice":
            parser.prog = "sluice"
        autodiscover_modules("sluice_cli")
        sub = parser.add_subparsers(dest="action", required=True, metavar="COMMAND")
        for group in groups():
            group(self).add_to(sub)

    def handle(self, *args, **options) -> None:
        if not options.get("skip_checks"):
            worker = options["action"] == "worker"
            self.check(tags=sorted(checks.registry.registry.tags_available() - WEB_CHECK_TAGS) if worker else None)
        try:
            options["handler"](options)
        except (SluiceError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"database error: {exc}".strip()) from exc
