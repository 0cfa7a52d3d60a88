"""`sluice outbox list|dispatch|cleanup|stats`, and the outbox record JSON they print."""
from __future__ import annotations

import json
from typing import Any

from core.cli.base import CommandError, Group, command_group, positive
from core.conf import get_settings
from core.outbox import Outbox, UnreadableOperations, decode_operations, describe


def outbox_record_json(row) -> dict[str, Any]:
    """An outbox record as `outbox list --json` prints it (a public, stable format)."""
    try:
        destinations: list[str] | None = [describe(op) for op in decode_operations(row.operations)]
    except UnreadableOperations:
        destinations = None
    return {
        "message_id": row.message_id,
        "dispatched": row.dispatched,
        "dispatched_at": row.dispatched_at.isoformat() if row.dispatched_at else None,
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "persistence_version": row.persistence_version,
        "operations": None if destinations is None else len(destinations),
        "destinations": destinations,
        "quarantined": row.quarantined,
        "last_error": row.last_error,
        "bytes": len(row.operations.encode("utf-8")),
    }


@command_group
class OutboxCommands(Group):
    def add_to(self, sub) -> None:
        outbox = sub.add_parser("outbox", help="look at and operate the outbox")
        osub = outbox.add_subparsers(dest="outbox_action", required=True, metavar="ACTION")
        olist = self.handles(osub.add_parser(
            "list", help="outbox records, newest first (undispatched: oldest first)"), self.list)
        olist.add_argument("--undispatched", action="store_true", help="only records not dispatched yet")
        olist.add_argument("--limit", type=int, default=50)
        olist.add_argument("--json", action="store_true")
        odispatch = self.handles(osub.add_parser(
            "dispatch", help="dispatch one record now (a quarantined one too), or every undispatched one"),
            self.dispatch)
        odispatch.add_argument("message_id", nargs="?")
        self.handles(osub.add_parser("cleanup", help="delete de-duplication data older than the retention now"),
                     self.cleanup)
        ostats = self.handles(osub.add_parser(
            "stats", help="records, undispatched, storage size, oldest undispatched age"), self.stats)
        ostats.add_argument("--json", action="store_true")

    @staticmethod
    def _outbox() -> Outbox:
        outbox = Outbox()
        outbox.store.require()
        return outbox

    def list(self, options: dict[str, Any]) -> None:
        limit = positive(options)
        rows = [outbox_record_json(r) for r in
                self._outbox().store.records(undispatched_only=options["undispatched"], limit=limit)]
        if options["json"]:
            self.stdout.write(json.dumps(rows))
            return
        self.stdout.write(f"{'MESSAGE ID':38} {'STATE':12} {'CREATED':26} DESTINATIONS")
        for r in rows:
            state = "quarantined" if r["quarantined"] else ("dispatched" if r["dispatched"] else "undispatched")
            where = "<unreadable>" if r["destinations"] is None else ", ".join(r["destinations"]) or "-"
            self.stdout.write(f"{r['message_id']:38} {state:12} {r['created_at'] or '-':26} {where}")
            if r["last_error"]:
                self.stdout.write(f"  last error: {r['last_error'][:300]}")

    def cleanup(self, options: dict[str, Any]) -> None:
        n = self._outbox().cleanup()
        self.stdout.write(f"deleted {n} outbox record(s) older than "
                          f"{get_settings().OUTBOX_KEEP_DEDUPLICATION_DATA_FOR:g} s")

    def stats(self, options: dict[str, Any]) -> None:
        st = self._outbox().store.stats()
        data = {"records": st.records, "undispatched": st.undispatched, "bytes": st.bytes,
                "oldest_undispatched_age_s": st.oldest_undispatched_age_s,
                "quarantined": st.quarantined, "table": st.table}
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        for key, value in data.items():
            self.stdout.write(f"{key:26} {'-' if value is None else value}")

    def dispatch(self, options: dict[str, Any]) -> None:
        outbox = self._outbox()
        message_id = options["message_id"]
        if message_id is not None:
            row = outbox.store.record(message_id)
            if row is None:
                raise CommandError(f"no outbox record {message_id!r}")
            if row.dispatched:
                self.stdout.write(f"{message_id} was dispatched already")
                return
            report = outbox.dispatch([message_id], include_quarantined=True)
        else:
            report = outbox.dispatch([])
            while ids := outbox.store.due(0, 500, include_failed=True):
                step = outbox.dispatch(ids)
                report.dispatched += step.dispatched
                report.failed.update(step.failed)
                for mid in step.dispatched:
                    report.failed.pop(mid, None)
                report.quarantined += step.quarantined
                if not step.dispatched:
                    break
        self.stdout.write(f"dispatched {len(report.dispatched)} record(s)")
        problems = [f"{mid}: {error}" for mid, error in report.failed.items()]
        problems += [f"{mid}: quarantined (operations unreadable)" for mid in report.quarantined]
        if problems:
            raise CommandError("not dispatched:\n" + "\n".join(problems))
