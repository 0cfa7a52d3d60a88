"""`sluice setup` and `sluice queue create|list|delete|purge|pause|resume|limit`."""
from __future__ import annotations

import argparse
import json
from typing import Any

from core import queues
from core.runtime import limits, pauses
from core.cli.base import CommandError, Group, cli_actor, command_group
from core.setup import setup_infrastructure
from core.transport import Transport


@command_group
class QueueCommands(Group):
    def add_to(self, sub) -> None:
        self.handles(sub.add_parser(
            "setup", help="migrate and create the error queue and every handled queue (idempotent)"), self.setup)

        queue = sub.add_parser("queue", help="create, list, delete, purge, pause, resume or limit queues")
        qsub = queue.add_subparsers(dest="queue_action", required=True, metavar="ACTION")
        create = self.handles(qsub.add_parser(
            "create", help="create a queue (idempotent; given settings are applied)"), self.create)
        create.add_argument("name")
        create.add_argument("--ttl", help="default TTL in seconds, also the ceiling for messages' own TTL")
        create.add_argument("--dead-letter-on-expiry", action="store_true",
                            help="move expired messages to NAME.deadletter instead of dropping them")
        create.add_argument("--auto-delete-on-idle", metavar="S",
                            help="temporary queue: delete it after S idle seconds (at least 300)")
        listing = self.handles(qsub.add_parser("list", help="every queue with its pending and expired counts"),
                               self.list)
        listing.add_argument("--json", action="store_true")
        delete = self.handles(qsub.add_parser("delete", help="drop a queue and its messages"), self.delete)
        delete.add_argument("name")
        purge = self.handles(qsub.add_parser(
            "purge", help="delete a queue's messages (in batches, skipping ones being received)"), self.purge)
        purge.add_argument("name")
        purge.add_argument("--expired-only", action="store_true")
        pause = self.handles(qsub.add_parser(
            "pause", help="stop every worker receiving from a queue until it is resumed (sends still land; "
                          "the pause is kept in the database, audited)"), self.pause)
        pause.add_argument("name")
        pause.add_argument("--json", action="store_true")
        resume = self.handles(qsub.add_parser("resume", help="let the workers receive from a paused queue again"),
                              self.resume)
        resume.add_argument("name")
        resume.add_argument("--json", action="store_true")
        limit = self.handles(qsub.add_parser(
            "limit", help="show or set a queue's limits across every worker: at most N messages at once, R per "
                          "second (kept in the database, audited; they win over SLUICE_QUEUE_LIMITS)"), self.limit)
        limit.add_argument("name")
        limit.add_argument("--concurrency", metavar="N", type=_limit_arg,
                           help="messages handled at once across every worker (none: no limit)")
        limit.add_argument("--rate", metavar="R", type=_limit_arg,
                           help="messages taken per second across every worker (none: no limit)")
        limit.add_argument("--clear", action="store_true",
                           help="drop the limits set here: SLUICE_QUEUE_LIMITS applies again")
        limit.add_argument("--json", action="store_true")

    def setup(self, options: dict[str, Any]) -> None:
        for name, created in setup_infrastructure():
            self.stdout.write(f"{'created' if created else 'exists '} {name}")
        self.stdout.write("setup complete")

    def create(self, options: dict[str, Any]) -> None:
        record, created = queues.create_queue(
            options["name"], ttl=options["ttl"], dead_letter_on_expiry=options["dead_letter_on_expiry"],
            auto_delete_on_idle=options["auto_delete_on_idle"])
        self.stdout.write(f"{'created' if created else 'updated'} queue {record.name}")

    def list(self, options: dict[str, Any]) -> None:
        transport = Transport()
        paused = pauses.paused_queues()
        limited = limits.limits_in_force()
        rows = []
        for record in queues.list_queues():
            counts = transport.counts(record.name)
            rows.append({
                "name": record.name, "kind": record.kind,
                "pending": counts.pending, "expired": counts.expired, "total": counts.total,
                "ttl_seconds": record.default_ttl_seconds,
                "dead_letter_on_expiry": record.dead_letter_on_expiry,
                "auto_delete_on_idle_seconds": record.auto_delete_on_idle_seconds,
                "paused": record.name in paused,
                "concurrency_limit": limited[record.name].concurrency if record.name in limited else None,
                "rate_limit": limited[record.name].rate if record.name in limited else None,
            })
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        self.stdout.write(f"{'QUEUE':30} {'KIND':12} {'PENDING':>9} {'EXPIRED':>9} {'TTL s':>9}")
        for r in rows:
            ttl = "-" if r["ttl_seconds"] is None else f"{r['ttl_seconds']:g}"
            self.stdout.write(f"{r['name']:30} {r['kind']:12} {r['pending']:>9} {r['expired']:>9} {ttl:>9}")

    def delete(self, options: dict[str, Any]) -> None:
        queues.delete_queue(options["name"])
        self.stdout.write(f"deleted queue {options['name']}")

    def purge(self, options: dict[str, Any]) -> None:
        n = Transport().purge(options["name"], expired_only=options["expired_only"])
        self.stdout.write(f"purged {n} {'expired ' if options['expired_only'] else ''}message(s) from {options['name']}")

    def pause(self, options: dict[str, Any]) -> None:
        info, changed = pauses.pause(options["name"], by=cli_actor(), via="cli")
        if options["json"]:
            self.stdout.write(json.dumps({**info.as_json(), "changed": changed}))
        elif changed:
            self.stdout.write(f"paused queue {info.queue}: workers receive nothing from it until "
                              f"`sluice queue resume {info.queue}`")
        else:
            self.stdout.write(f"queue {info.queue} was already paused (since {info.paused_at.isoformat()}, "
                              f"by {info.paused_by or '?'})")

    def resume(self, options: dict[str, Any]) -> None:
        name = options["name"]
        changed = pauses.resume(name, by=cli_actor(), via="cli")
        if options["json"]:
            self.stdout.write(json.dumps({"queue": name, "paused": False, "changed": changed}))
        else:
            self.stdout.write(f"resumed queue {name}" if changed else f"queue {name} was not paused")

    def limit(self, options: dict[str, Any]) -> None:
        name = options["name"]
        given = {kind: options[kind] for kind in ("concurrency", "rate") if options[kind] is not None}
        if options["clear"] and given:
            raise CommandError("--clear drops the queue's limits: give it without --concurrency and --rate")
        changed = False
        if options["clear"]:
            changed = limits.clear_limits(name, by=cli_actor(), via="cli")
        elif given:
            now = limits.limits_of(queues.registry.get(name).name)
            wanted = {"concurrency": now.concurrency, "rate": now.rate}  # an option not given keeps its limit
            wanted.update({kind: None if value == "none" else value for kind, value in given.items()})
            try:
                _, changed = limits.set_limits(name, **wanted, by=cli_actor(), via="cli")
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        found = limits.limits_of(queues.registry.get(name).name)
        if options["json"]:
            self.stdout.write(json.dumps({**found.as_json(), "changed": changed}))
            return
        described = ", ".join(part for part in (
            f"at most {found.concurrency} at once" if found.concurrency else "",
            f"at most {found.rate} per second" if found.rate else "") if part) or "no limits"
        source = {"database": f" (set by {found.set_by or '?'})", "settings": " (SLUICE_QUEUE_LIMITS)"}.get(found.source, "")
        self.stdout.write(f"queue {found.queue}: {described}{source}")


def _limit_arg(text: str) -> int | str:
    """A limit on the command line: a whole number 1–10,000, or ``none``."""
    if text.strip().lower() == "none":
        return "none"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a whole number or none, not {text!r}") from None
