"""`python manage.py sluice …` — Sluice's command line.  Thin: parse, call core, print.

Sub-commands (see README "Command line" for the JSON formats, which are stable):
  setup
  queue create NAME [--ttl S] [--dead-letter-on-expiry] [--auto-delete-on-idle S]
  queue list [--json] | queue delete NAME | queue purge NAME [--expired-only]
  send QUEUE [--body TEXT | --body-file PATH] [--type T] [--header K=V]… [--ttl S] [--message-id ID]
       [--delay S | --deliver-at ISO8601]
  delayed list [--json] | delayed deliver-now ID | delayed delete ID
  peek QUEUE [--limit N] [--json]
  receive QUEUE [--json]
  worker [--queue Q]… [--concurrency N] [--demo-traffic] [--until-empty]
  outbox list [--undispatched] [--limit N] [--json] | outbox dispatch [ID]
  outbox cleanup | outbox stats [--json]
"""
from __future__ import annotations

import base64
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from core.conf import get_settings
from core.errors import SluiceError
from core.messages import Headers, Message


def message_json(message: Message) -> dict[str, Any]:
    """A message as the CLI's --json prints it (a public, stable format)."""
    text = message.text
    return {
        "id": message.headers.get(Headers.MESSAGE_ID, message.id),
        "type": message.message_type,
        "headers": message.headers,
        "body": text,
        "body_base64": None if text is not None else base64.b64encode(message.body).decode("ascii"),
        "expires": message.expires.isoformat() if message.expires else None,
        "expired": message.expired,
        "correlation_id": message.headers.get(Headers.CORRELATION_ID, message.correlation_id),
        "row_version": message.row_version,
        "poison": message.poison,
    }


def outbox_record_json(row) -> dict[str, Any]:
    """An outbox record as `outbox list --json` prints it (a public, stable format)."""
    from core.outbox_ops import UnreadableOperations, decode_operations, describe

    try:
        operations = decode_operations(row.operations)
        destinations: list[str] | None = [describe(op) for op in operations]
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


def parse_header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise CommandError(f"--header wants KEY=VALUE, not {text!r}")
    return key, value


class Command(BaseCommand):
    help = "Sluice: SQL-table messaging (queues, sending, browsing, workers)."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="COMMAND")

        sub.add_parser("setup", help="migrate and create the error queue and every handled queue (idempotent)")

        queue = sub.add_parser("queue", help="create, list, delete or purge queues")
        qsub = queue.add_subparsers(dest="queue_action", required=True, metavar="ACTION")
        create = qsub.add_parser("create", help="create a queue (idempotent; given settings are applied)")
        create.add_argument("name")
        create.add_argument("--ttl", help="default TTL in seconds, also the ceiling for messages' own TTL")
        create.add_argument("--dead-letter-on-expiry", action="store_true",
                            help="move expired messages to NAME.deadletter instead of dropping them")
        create.add_argument("--auto-delete-on-idle", metavar="S",
                            help="temporary queue: delete it after S idle seconds (at least 300)")
        listing = qsub.add_parser("list", help="every queue with its pending and expired counts")
        listing.add_argument("--json", action="store_true")
        delete = qsub.add_parser("delete", help="drop a queue and its messages")
        delete.add_argument("name")
        purge = qsub.add_parser("purge", help="delete a queue's messages (in batches, skipping ones being received)")
        purge.add_argument("name")
        purge.add_argument("--expired-only", action="store_true")

        send = sub.add_parser("send", help="send one message; prints its id")
        send.add_argument("queue")
        body = send.add_mutually_exclusive_group()
        body.add_argument("--body", help="the body as text")
        body.add_argument("--body-file", help="read the body from a file ('-' for stdin)")
        send.add_argument("--type", dest="message_type", help="message type (EnclosedMessageTypes)")
        send.add_argument("--header", action="append", default=[], metavar="K=V")
        send.add_argument("--ttl", help="time to be received, seconds")
        send.add_argument("--message-id")
        send.add_argument("--correlation-id")
        send.add_argument("--reply-to")
        send.add_argument("--content-type")
        later = send.add_mutually_exclusive_group()
        later.add_argument("--delay", help="deliver after S seconds (through the delayed store)")
        later.add_argument("--deliver-at", help="deliver at an ISO 8601 time with an offset, e.g. 2026-11-22T10:00:00Z")

        delayed = sub.add_parser("delayed", help="messages waiting in the delayed store")
        dsub = delayed.add_subparsers(dest="delayed_action", required=True, metavar="ACTION")
        dlist = dsub.add_parser("list", help="stored messages by due time")
        dlist.add_argument("--json", action="store_true")
        dlist.add_argument("--limit", type=int, default=1000)
        now = dsub.add_parser("deliver-now", help="make a stored message due now")
        now.add_argument("id")
        dele = dsub.add_parser("delete", help="delete a stored message")
        dele.add_argument("id")

        peek = sub.add_parser("peek", help="look at messages in FIFO order without taking them")
        peek.add_argument("queue")
        peek.add_argument("--limit", type=int, default=20)
        peek.add_argument("--json", action="store_true")

        receive = sub.add_parser("receive", help="take the next message off a queue for good")
        receive.add_argument("queue")
        receive.add_argument("--json", action="store_true")

        worker = sub.add_parser("worker", help="run the message pumps in this process (Ctrl-C stops)")
        worker.add_argument("--queue", action="append", default=[], dest="queues",
                            help="queue to serve (repeatable); default: every queue with a handler")
        worker.add_argument("--concurrency", type=int)
        worker.add_argument("--demo-traffic", action="store_true",
                            help="also send demo messages to the demo queue (SLUICE_DEMO_RATE per second)")
        worker.add_argument("--until-empty", action="store_true",
                            help="exit once every served queue is empty and the outbox has nothing to dispatch")
        worker.add_argument("--no-mover", action="store_true",
                            help="do not run the delayed-message mover in this worker")

        failed = sub.add_parser("failed", help="failed messages ingested from the error queue")
        fsub = failed.add_subparsers(dest="failed_action", required=True, metavar="ACTION")
        fsub.add_parser("ingest", help="ingest the error queue now")
        flist = fsub.add_parser("list", help="failed messages, newest failure first")
        flist.add_argument("--json", action="store_true")
        flist.add_argument("--status", choices=["unresolved", "retry_pending", "resolved", "archived"])
        flist.add_argument("--group")
        flist.add_argument("--queue")
        flist.add_argument("--search", help="text in the message id, type, exception or body")
        flist.add_argument("--limit", type=int, default=100)
        fgroups = fsub.add_parser("groups", help="unresolved failures grouped by exception type and first frame")
        fgroups.add_argument("--json", action="store_true")
        for name, what in (("retry", "send back to their queues"), ("archive", "archive")):
            p = fsub.add_parser(name, help=f"{what}: ids, a group, or --all")
            p.add_argument("ids", nargs="*")
            p.add_argument("--group")
            p.add_argument("--all", action="store_true", help="every unresolved failure (optionally --queue)")
            p.add_argument("--queue")
        for name in ("restore", "delete"):
            p = fsub.add_parser(name, help=f"{name} failed messages by id")
            p.add_argument("ids", nargs="+")

        status = sub.add_parser("status", help="workers, their loops and circuit breakers (from Redis)")
        status.add_argument("--json", action="store_true")


        outbox = sub.add_parser("outbox", help="look at and operate the outbox")
        osub = outbox.add_subparsers(dest="outbox_action", required=True, metavar="ACTION")
        olist = osub.add_parser("list", help="outbox records, newest first (undispatched: oldest first)")
        olist.add_argument("--undispatched", action="store_true", help="only records not dispatched yet")
        olist.add_argument("--limit", type=int, default=50)
        olist.add_argument("--json", action="store_true")
        odispatch = osub.add_parser("dispatch", help="dispatch one record now (a quarantined one too), "
                                                     "or every undispatched one")
        odispatch.add_argument("message_id", nargs="?")
        osub.add_parser("cleanup", help="delete de-duplication data older than the retention now")
        ostats = osub.add_parser("stats", help="records, undispatched, storage size, oldest undispatched age")
        ostats.add_argument("--json", action="store_true")

    def handle(self, *args, **options) -> None:
        action = options["action"]
        method = getattr(self, f"do_{action}")
        try:
            method(options)
        except (SluiceError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            raise CommandError(f"database error: {exc}".strip()) from exc

    # -- sub-commands ---------------------------------------------------------------
    def do_setup(self, options) -> None:
        from core.setup import setup_infrastructure

        for name, created in setup_infrastructure():
            self.stdout.write(f"{'created' if created else 'exists '} {name}")
        self.stdout.write("setup complete")

    def do_queue(self, options) -> None:
        from core import queues
        from core.transport import Transport

        act = options["queue_action"]
        if act == "create":
            record, created = queues.create_queue(
                options["name"], ttl=options["ttl"], dead_letter_on_expiry=options["dead_letter_on_expiry"],
                auto_delete_on_idle=options["auto_delete_on_idle"])
            self.stdout.write(f"{'created' if created else 'updated'} queue {record.name}")
        elif act == "list":
            transport = Transport()
            rows = []
            for record in queues.list_queues():
                counts = transport.counts(record.name)
                rows.append({
                    "name": record.name, "kind": record.kind,
                    "pending": counts.pending, "expired": counts.expired, "total": counts.total,
                    "ttl_seconds": record.default_ttl_seconds,
                    "dead_letter_on_expiry": record.dead_letter_on_expiry,
                    "auto_delete_on_idle_seconds": record.auto_delete_on_idle_seconds,
                })
            if options["json"]:
                self.stdout.write(json.dumps(rows))
            else:
                self.stdout.write(f"{'QUEUE':30} {'KIND':12} {'PENDING':>9} {'EXPIRED':>9} {'TTL s':>9}")
                for r in rows:
                    ttl = "-" if r["ttl_seconds"] is None else f"{r['ttl_seconds']:g}"
                    self.stdout.write(f"{r['name']:30} {r['kind']:12} {r['pending']:>9} {r['expired']:>9} {ttl:>9}")
        elif act == "delete":
            queues.delete_queue(options["name"])
            self.stdout.write(f"deleted queue {options['name']}")
        elif act == "purge":
            n = Transport().purge(options["name"], expired_only=options["expired_only"])
            self.stdout.write(f"purged {n} {'expired ' if options['expired_only'] else ''}message(s) from {options['name']}")

    def do_send(self, options) -> None:
        from core.transport import Transport

        if options["body_file"]:
            path = options["body_file"]
            try:
                body: bytes = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
            except OSError as exc:
                raise CommandError(f"cannot read --body-file {path}: {exc.strerror}") from exc
        else:
            body = (options["body"] or "").encode("utf-8")
        headers = dict(parse_header(h) for h in options["header"])
        message_id = Transport().send(
            options["queue"], body, message_type=options["message_type"], headers=headers or None,
            ttl=options["ttl"], message_id=options["message_id"], correlation_id=options["correlation_id"],
            reply_to=options["reply_to"], content_type=options["content_type"] or
            ("application/octet-stream" if options["body_file"] else "text/plain"),
            delay=options["delay"], deliver_at=options["deliver_at"])
        self.stdout.write(message_id)

    def do_delayed(self, options) -> None:
        from core.delayed import delayed_store

        store = delayed_store()
        act = options["delayed_action"]
        if act == "list":
            if options["limit"] < 1:
                raise CommandError("--limit must be at least 1")
            messages, now = store.list(options["limit"])
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
        elif act == "deliver-now":
            if not store.deliver_now(options["id"]):
                raise CommandError(f"no delayed message {options['id']!r}")
            self.stdout.write(f"{options['id']} is due now")
        elif act == "delete":
            if not store.delete(options["id"]):
                raise CommandError(f"no delayed message {options['id']!r}")
            self.stdout.write(f"deleted delayed message {options['id']}")

    def do_peek(self, options) -> None:
        from core.transport import Transport

        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        messages = Transport().browse(options["queue"], limit=options["limit"])
        if options["json"]:
            self.stdout.write(json.dumps([message_json(m) for m in messages]))
            return
        for m in messages:
            data = message_json(m)
            body = data["body"] if data["body"] is not None else f"<{len(m.body)} bytes, base64 in --json>"
            flag = " EXPIRED" if m.expired else (" POISON" if m.poison else "")
            self.stdout.write(f"{data['id']}  {data['type'] or '-'}{flag}  expires={data['expires'] or '-'}\n  {body[:200]}")

    def do_receive(self, options) -> None:
        from core.consumer import receive_one

        message = receive_one(options["queue"])
        if options["json"]:
            self.stdout.write(json.dumps(message_json(message) if message else None))
        elif message is None:
            self.stdout.write("(queue is empty)")
        else:
            data = message_json(message)
            self.stdout.write(json.dumps(data, indent=2))

    def do_worker(self, options) -> None:
        from django.conf import settings

        from core.worker import WorkerHost

        host = WorkerHost(options["queues"], concurrency=options["concurrency"], mover=not options["no_mover"],
                          demo_traffic=options["demo_traffic"], redis_url=settings.REDIS_URL)
        stop = threading.Event()

        def request_stop(signum, frame) -> None:
            if stop.is_set():  # a second signal: leave now; open transactions roll back
                raise SystemExit(1)
            self.stderr.write("stopping: finishing in-flight messages (signal again to abort)")
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        host.start()
        self.stdout.write(f"worker serving {', '.join(host.queues)}; Ctrl-C stops")
        self.stdout.flush()
        try:
            while not stop.is_set():
                stop.wait(0.2)
                if options["until_empty"] and host.is_empty():
                    break
        finally:
            host.stop()
        for line in host.summary():
            self.stdout.write(line)

    def do_status(self, options) -> None:
        from django.conf import settings

        from core.health import read_health

        health = read_health(settings.REDIS_URL)
        if options["json"]:
            self.stdout.write(json.dumps(health))
            return
        self.stdout.write(f"redis: {health['redis']}" + (f" ({health['error']})" if health.get("error") else ""))
        if not health["workers"]:
            self.stdout.write("no workers seen in the last 15 s")
        for w in health["workers"]:
            self.stdout.write(f"worker {w['name']} (last seen {w['last_seen']})")
            for loop in w["loops"]:
                self.stdout.write(f"  loop {loop['name']:40} {'alive' if loop['alive'] else 'DEAD':5} "
                                  f"steps {loop['steps']} errors {loop['errors']}")
            for b in w["breakers"]:
                self.stdout.write(f"  breaker {b['name']:37} {b['state']}"
                                  + (f"  {b['last_error']}" if b["state"] != "closed" else ""))

    def do_failed(self, options) -> None:
        from core import failures

        act = options["failed_action"]
        if act == "ingest":
            self.stdout.write(f"ingested {failures.ingest_errors()} message(s)")
        elif act == "list":
            if options["limit"] < 1:
                raise CommandError("--limit must be at least 1")
            rows = failures.search(text=options["search"], status=options["status"], group=options["group"],
                                   queue=options["queue"])[:options["limit"]]
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
        elif act == "groups":
            data = [{"group": g.group_key, "title": g.title, "count": g.count, "exception_type": g.exception_type,
                     "last_failed": g.last_failed.isoformat() if g.last_failed else None}
                    for g in failures.groups()]
            if options["json"]:
                self.stdout.write(json.dumps(data))
                return
            for g in data:
                self.stdout.write(f"{g['count']:6}  {g['group']}  {g['title']}")
        elif act in ("retry", "archive"):
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
            op = start(selection, requested_by="cli")
            op = self._run_with_progress(op)
            self.stdout.write(f"{act}: {op.done} done, {op.failed} failed of {op.total}")
            if op.error:
                self.stderr.write(op.error)
        elif act == "restore":
            self.stdout.write(f"restored {failures.restore(options['ids'], requested_by='cli')}")
        elif act == "delete":
            self.stdout.write(f"deleted {failures.delete(options['ids'])}")

    def _run_with_progress(self, op):
        """Run a bulk operation here, drawing a progress bar on stderr from its row."""
        from core import failures
        from core.models import BulkOperation

        result: dict = {}

        def work() -> None:
            try:
                result["op"] = failures.run_operation(op.pk)
            except Exception as exc:  # noqa: BLE001 — reported below
                result["error"] = exc
            finally:
                from django.db import connections

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

    def do_outbox(self, options) -> None:
        from core.outbox import Outbox

        outbox = Outbox()
        outbox.store.require()
        act = options["outbox_action"]
        if act == "list":
            if options["limit"] < 1:
                raise CommandError("--limit must be at least 1")
            rows = [outbox_record_json(r) for r in
                    outbox.store.records(undispatched_only=options["undispatched"], limit=options["limit"])]
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
        elif act == "dispatch":
            self._outbox_dispatch(outbox, options["message_id"])
        elif act == "cleanup":
            n = outbox.cleanup()
            self.stdout.write(f"deleted {n} outbox record(s) older than "
                              f"{get_settings().OUTBOX_KEEP_DEDUPLICATION_DATA_FOR:g} s")
        elif act == "stats":
            st = outbox.store.stats()
            data = {"records": st.records, "undispatched": st.undispatched, "bytes": st.bytes,
                    "oldest_undispatched_age_s": st.oldest_undispatched_age_s,
                    "quarantined": st.quarantined, "table": st.table}
            if options["json"]:
                self.stdout.write(json.dumps(data))
            else:
                for key, value in data.items():
                    self.stdout.write(f"{key:26} {'-' if value is None else value}")

    def _outbox_dispatch(self, outbox, message_id: str | None) -> None:
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
