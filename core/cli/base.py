"""What every group of `sluice` sub-commands shares: the group base class, the registry
the management command reads, and the JSON shapes several groups print.

A Django app adds commands to `sluice` by defining a module ``<app>.sluice_cli`` that
registers :class:`Group` subclasses with :func:`command_group`; the management command
imports every installed app's ``sluice_cli`` (like the admin's ``admin.py``), so the engine
never imports the dashboard or the workers to offer their commands.
"""
from __future__ import annotations

import abc
import argparse
import getpass
from typing import Any, Callable

from django.core.management.base import BaseCommand, CommandError

__all__ = ["CommandError", "Group", "cli_actor", "command_group", "groups", "positive", "parse_header"]

_groups: list[type["Group"]] = []


class Group(abc.ABC):
    """Some sub-commands: :meth:`add_to` adds their parsers, each with its handler set as
    ``parser.set_defaults(handler=self.method)``; a handler takes the parsed options."""

    def __init__(self, command: BaseCommand) -> None:
        self.command = command

    # The command's streams are read when a handler runs: call_command(stdout=…) swaps
    # them after the parser (and so this group) was built.
    @property
    def stdout(self):
        return self.command.stdout

    @property
    def stderr(self):
        return self.command.stderr

    @abc.abstractmethod
    def add_to(self, sub: argparse._SubParsersAction) -> None:
        """Add this group's parsers to the top-level sub-parsers."""

    @staticmethod
    def handles(parser: argparse.ArgumentParser, handler: Callable[[dict[str, Any]], None]) -> argparse.ArgumentParser:
        parser.set_defaults(handler=handler)
        return parser


def command_group(cls: type[Group]) -> type[Group]:
    """Class decorator: offer this group's commands in `sluice` (idempotent)."""
    if cls not in _groups:
        _groups.append(cls)
    return cls


def groups() -> list[type[Group]]:
    return list(_groups)


def positive(options: dict[str, Any], name: str = "limit") -> int:
    """An option that must be at least 1 (a clear error, not an empty listing)."""
    value = options[name]
    if value < 1:
        raise CommandError(f"--{name.replace('_', '-')} must be at least 1")
    return value


def parse_header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise CommandError(f"--header wants KEY=VALUE, not {text!r}")
    return key, value


def cli_actor() -> str:
    """Who runs this command: the operating-system user (there is no dashboard login here)."""
    try:
        return f"{getpass.getuser()} (cli)"
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "? (cli)"
