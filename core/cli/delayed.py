"""`sluice delayed list|deliver-now|delete`: the delayed-message store."""
from __future__ import annotations

import json
from typing import Any

from core.cli.base import CommandError, Group, command_group, positive
from core.delayed import delayed_store
from core.messages import Headers


@command_group
class DelayedCommands(Group):
    def add_to(self, sub) -> None:
        delayed = sub.add_parser("delayed", help="messages waiting in the delayed store")
        dsub = delayed.add_subparsers(dest="delayed_action", required=True, metavar="ACTION")
        dlist = self.handles(dsub.add_parser("list", help="stored messages by due time"), self.list)
        dlist.add_argument("--json", action="store_true")
        dlist.add_argument("--limit", type=int, default=1000)
        now = self.handles(dsub.add_parser("deliver-now", help="make a stored message due now"), self.deliver_now)
        now.add_argument("id")
        dele = self.handles(dsub.add_parser("delete", help="delete a stored message"), self.delete)
        dele.add_argument("id")

    def list(self, options: dict[str, Any]) -> None:
        messages, now = delayed_store().list(positive(options), bodies=False)
        rows = [{
            "id": m.id, "destination": m.destination, "due": m.due.isoformat() if m.due else None,
            "retry_count": m.retry_count, "type": m.message_type,
            "state": "due" if m.due and m.due <= now else "scheduled",
            "due_in_s": round((m.due - now).total_seconds(), 3) if m.due else None,
            "delayed_retry": m.headers.get(Headers.DELAYED_RETRIES),
        } for m in messages]
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        self.stdout.write(f"{'DUE (UTC)':32} {'STATE':9} {'DESTINATION':24} {'TYPE':16} ID")
        for r in rows:
            self.stdout.write(f"{r['due'] or '-':32} {r['state']:9} {r['destination']:24} "
                              f"{r['type'] or '-':16} {r['id']}")

    def deliver_now(self, options: dict[str, Any]) -> None:
        if not delayed_store().deliver_now(options["id"]):
            raise CommandError(f"no delayed message {options['id']!r}")
        self.stdout.write(f"{options['id']} is due now")

    def delete(self, options: dict[str, Any]) -> None:
        if not delayed_store().delete(options["id"]):
            raise CommandError(f"no delayed message {options['id']!r}")
        self.stdout.write(f"deleted delayed message {options['id']}")
