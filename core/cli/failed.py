"""`sluice failed …`: failed messages ingested from the error queue, and bulk operations
run in place with a progress bar."""
from __future__ import annotations

import json
import threading
from typing import Any

from django.db import connections

from core import failures
from core.cli.base import CommandError, Group, command_group, positive
from core.models import BulkOperation


@command_group
class FailedCommands(Group):
    def add_to(self, sub) -> None:
        failed = sub.add_parser("failed", help="failed messages ingested from the error queue")
        fsub = failed.add_subparsers(dest="failed_action", required=True, metavar="ACTION")
        self.handles(fsub.add_parser("ingest", help="ingest the error queue now"), self.ingest)
        flist = self.handles(fsub.add_parser("list", help="failed messages, newest failure first"), self.list)
        flist.add_argument("--json", action="store_true")
        flist.add_argument("--status", choices=["unresolved", "retry_pending", "resolved", "archived"])
        flist.add_argument("--group")
        flist.add_argument("--queue")
        flist.add_argument("--search", help="text in the message id, type, exception or body")
        flist.add_argument("--limit", type=int, default=100)
        fgroups = self.handles(fsub.add_parser(
            "groups", help="unresolved failures grouped by exception type and first frame"), self.groups)
        fgroups.add_argument("--json", action="store_true")
        for name, what in (("retry", "send back to their queues"), ("archive", "archive")):
            p = self.handles(fsub.add_parser(name, help=f"{what}: ids, a group, or --all"), self.bulk)
            p.add_argument("ids", nargs="*")
            p.add_argument("--group")
            p.add_argument("--all", action="store_true", help="every unresolved failure (optionally --queue)")
            p.add_argument("--queue")
        for name, handler in (("restore", self.restore), ("delete", self.delete)):
            p = self.handles(fsub.add_parser(name, help=f"{name} failed messages by id"), handler)
            p.add_argument("ids", nargs="+")

    def ingest(self, options: dict[str, Any]) -> None:
        self.stdout.write(f"ingested {failures.ingest_errors()} message(s)")

    def list(self, options: dict[str, Any]) -> None:
        rows = failures.search(text=options["search"], status=options["status"], group=options["group"],
                               queue=options["queue"])[:positive(options)]
        data = [{"message_id": r.message_id, "queue": r.original_queue, "type": r.message_type,
                 "exception_type": r.exception_type, "exception_message": r.exception_message,
                 "group": r.group_key, "status": r.status, "attempts": r.attempts,
                 "failure_count": r.failure_count,
                 "time_of_failure": r.time_of_failure.isoformat() if r.time_of_failure else None}
                for r in rows]
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        for r in data:
            self.stdout.write(f"{r['time_of_failure']}  {r['status']:13} {r['queue']:20} {r['type'] or '-':14} "
                              f"{r['exception_type']}: {r['exception_message'][:60]}  {r['message_id']}")

    def groups(self, options: dict[str, Any]) -> None:
        data = [{"group": g.group_key, "title": g.title, "count": g.count, "exception_type": g.exception_type,
                 "last_failed": g.last_failed.isoformat() if g.last_failed else None}
                for g in failures.groups()]
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        for g in data:
            self.stdout.write(f"{g['count']:6}  {g['group']}  {g['title']}")

    def bulk(self, options: dict[str, Any]) -> None:
        act = options["failed_action"]
        chosen = [bool(options["ids"]), bool(options["group"]), options["all"]]
        if sum(chosen) != 1:
            raise CommandError("name ids, or --group G, or --all")
        if options["ids"]:
            selection = failures.by_ids(options["ids"])
        elif options["group"]:
            selection = failures.by_group(options["group"])
        else:
            selection = failures.all_unresolved(queue=options["queue"])
        start = failures.retry if act == "retry" else failures.start_archive
        op = self._run_with_progress(start(selection, requested_by="cli"))
        self.stdout.write(f"{act}: {op.done} done, {op.failed} failed of {op.total}")
        if op.error:
            self.stderr.write(op.error)

    def restore(self, options: dict[str, Any]) -> None:
        self.stdout.write(f"restored {failures.restore(options['ids'], requested_by='cli')}")

    def delete(self, options: dict[str, Any]) -> None:
        self.stdout.write(f"deleted {failures.delete(options['ids'])}")

    def _run_with_progress(self, op: BulkOperation) -> BulkOperation:
        """Run a bulk operation here, drawing a progress bar on stderr from its row."""
        result: dict = {}

        def work() -> None:
            try:
                result["op"] = failures.run_operation(op.pk)
            except Exception as exc:  # noqa: BLE001 — reported below
                result["error"] = exc
            finally:
                connections.close_all()

        thread = threading.Thread(target=work)
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
            current = BulkOperation.objects.get(pk=op.pk)
            total = max(current.total, 1)
            filled = int(30 * min(current.done + current.failed, total) / total)
            self.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {current.done + current.failed}/{current.total}",
                              ending="")
        self.stderr.write("")
        if "error" in result:
            raise CommandError(f"{op.kind} stopped: {result['error']}")
        return result["op"]
