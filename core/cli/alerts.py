"""`sluice alerts import|export|evaluate`: alert rules and targets as code, and one evaluation now."""
from __future__ import annotations

import json
from typing import Any

from core.alerts.config import ConfigError, export_config, import_config, parse
from core.alerts.evaluator import evaluate
from core.cli.base import CommandError, Group, command_group
from core.conf import get_settings


@command_group
class AlertCommands(Group):
    def add_to(self, sub) -> None:
        alerts = sub.add_parser("alerts", help="alert rules and targets: import / export as JSON, evaluate now")
        asub = alerts.add_subparsers(dest="alerts_action", required=True, metavar="ACTION")
        imp = self.handles(asub.add_parser(
            "import", help="create or update rules and targets from JSON (a file, or SLUICE_ALERTS_CONFIG)"),
            self.import_)
        imp.add_argument("file", nargs="?", help="a JSON file (default: SLUICE_ALERTS_CONFIG)")
        self.handles(asub.add_parser("export", help="rules and targets as JSON, secrets left out"), self.export)
        self.handles(asub.add_parser("evaluate", help="evaluate every enabled rule once, now"), self.evaluate)

    def import_(self, options: dict[str, Any]) -> None:
        source = options.get("file") or get_settings().ALERTS_CONFIG
        if not source:
            raise CommandError("name a JSON file, or set SLUICE_ALERTS_CONFIG")
        try:
            counts = import_config(parse(source))
        except ConfigError as exc:
            raise CommandError(f"nothing imported: {exc}") from None
        self.stdout.write(json.dumps(counts) + "\n")

    def export(self, options: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(export_config(), indent=2) + "\n")

    def evaluate(self, options: dict[str, Any]) -> None:
        result = evaluate()
        self.stdout.write(json.dumps({"rules": result.rules, "notifications": result.notifications,
                                      "errors": result.errors, "ms": round(result.ms, 1)}) + "\n")
