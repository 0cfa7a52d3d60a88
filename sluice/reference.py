"""The documentation's reference pages, generated from the code that defines them, so they
cannot drift: the settings from core/conf.py (names, types, defaults, and the ``#:`` help line
above each field), the command line from the ``sluice`` argument parsers, the JSON API from
its OpenAPI schema (drf-spectacular).

mkdocs calls these at build time (scripts/docs_hooks.py); tests/test_docs_reference.py fails
when a setting, command or endpoint has no description.  Needs Django set up.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class Entry:
    """One documented thing: a setting, a command or an endpoint."""

    name: str
    description: str
    details: dict[str, str]


# -- settings ---------------------------------------------------------------------------------

def settings_entries() -> list[Entry]:
    """Every SLUICE_* setting, with the ``#:`` comment lines right above its field."""
    from core import conf

    help_by_field = _field_comments(inspect.getsource(conf.SluiceSettings))
    return [Entry(name=f"SLUICE_{name}", description=help_by_field.get(name, ""),
                  details={"type": _type_name(f.type), "default": _default(
                      f.default_factory() if f.default is dataclasses.MISSING else f.default)})
            for name, f in conf.FIELDS.items()]


def _field_comments(source: str) -> dict[str, str]:
    lines = source.splitlines()
    comments = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = []
            i = node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                above.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            comments[node.target.id] = " ".join(above)
    return comments


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "")


def _default(value: Any) -> str:
    if isinstance(value, (tuple, dict)) and not value:
        return "(empty)"
    if isinstance(value, tuple):
        return ",".join(value) if value else "(empty)"
    if value in ("", None):
        return "(empty)"
    return str(value)


# -- command line -------------------------------------------------------------------------------

def command_entries() -> list[Entry]:
    """Every ``sluice`` sub-command (``sluice queue create`` ...), with its help and usage."""
    from core.management.commands.sluice import Command

    parser = Command().create_parser("sluice", "sluice")
    return list(_walk(parser, "sluice"))


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[Entry]:
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            command = f"{path} {name}"
            options = [a for a in sub._actions if not isinstance(a, (argparse._HelpAction,
                                                                     argparse._SubParsersAction))]
            yield Entry(name=command, description=helps.get(name, ""),
                        details={"usage": sub.format_usage().replace("usage: ", "").strip(),
                                 "options": _options(options)})
            yield from _walk(sub, command)


def _options(actions: list[argparse.Action]) -> str:
    own = [a for a in actions if a.dest not in _DJANGO_OPTIONS]
    return "\n".join(f"- `{', '.join(a.option_strings) or a.dest}`" + (f": {a.help}" if a.help else "")
                     for a in own)


#: Options every Django management command has (documented once, not per command).
_DJANGO_OPTIONS = {"version", "verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color",
                   "skip_checks"}


# -- JSON API ---------------------------------------------------------------------------------

def api_entries() -> list[Entry]:
    """Every operation of the JSON API's OpenAPI schema, with its summary."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [Entry(name=f"{method.upper()} {path}", description=operation.get("summary") or "",
                  details={"description": (operation.get("description") or "").strip()})
            for path, operations in schema["paths"].items()
            for method, operation in operations.items()]


# -- Markdown -----------------------------------------------------------------------------------

def settings_markdown() -> str:
    rows = [f"| `{e.name}` | {e.details['type']} | `{e.details['default']}` | {_cell(e.description)} |"
            for e in settings_entries()]
    return "\n".join(["| Setting | Type | Default | Meaning |", "| --- | --- | --- | --- |", *rows])


def commands_markdown() -> str:
    return "\n".join(_section(f"### `{e.name}`", e.description, f"```text\n{e.details['usage']}\n```",
                              e.details["options"]) for e in command_entries())


def api_markdown() -> str:
    return "\n".join(_section(f"### `{e.name}`", f"**{e.description}**", e.details["description"])
                     for e in api_entries())


def _section(*paragraphs: str) -> str:
    return "\n\n".join(p for p in paragraphs if p) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


#: What a page's ``<!-- reference: NAME -->`` marker is replaced with.
GENERATORS = {"settings": settings_markdown, "commands": commands_markdown, "api": api_markdown}
