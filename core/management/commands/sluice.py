"""`python manage.py sluice …` — Sluice's command line.  Thin: parse, call core, print.

Sub-commands (see README "Command line" for the JSON formats, which are stable):
  setup
  queue create NAME [--ttl S] [--dead-letter-on-expiry] [--auto-delete-on-idle S]
  queue list [--json] | queue delete NAME | queue purge NAME [--expired-only]
  send QUEUE [--body TEXT | --body-file PATH] [--type T] [--header K=V]… [--ttl S] [--message-id ID]
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
import time
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
            ("application/octet-stream" if options["body_file"] else "text/plain"))
        self.stdout.write(message_id)

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
        from core.demo.traffic import DemoTraffic
        from core.handlers import handlers, load_handler_modules
        from core.loops import ThreadRunner
        from core.outbox import OutboxDispatcher, worker_loops
        from core.pump import MessagePump
        from core.queues import registry

        load_handler_modules()
        names = options["queues"] or handlers.queues()
        if not names:
            raise CommandError("no queues to serve: register handlers (SLUICE_HANDLER_MODULES) or pass --queue")
        for name in names:
            registry.get(name)  # UnknownQueue → clear error before any thread starts
        pumps = [MessagePump(name, concurrency=options["concurrency"]) for name in names]
        loops: list = list(pumps)
        outbox_loops = worker_loops()
        loops += outbox_loops
        dispatchers = [loop for loop in outbox_loops if isinstance(loop, OutboxDispatcher)]
        if options["demo_traffic"]:
            loops.append(DemoTraffic(rate=get_settings().DEMO_RATE))
        stop = threading.Event()

        def request_stop(signum, frame) -> None:
            if stop.is_set():  # a second signal: leave now; open transactions roll back
                raise SystemExit(1)
            self.stderr.write("stopping: finishing in-flight messages (signal again to abort)")
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        runner = ThreadRunner(loops).start()
        self.stdout.write(f"worker serving {', '.join(names)}; Ctrl-C stops")
        self.stdout.flush()
        try:
            while not stop.is_set():
                stop.wait(0.2)
                if options["until_empty"] and all(p.receiver.peek_estimate(p.queue) == 0 for p in pumps) \
                        and not any(d.pending() for d in dispatchers):
                    break
        finally:
            for pump in pumps:
                pump.stop()
            runner.stop()
        for pump in pumps:
            s = pump.stats
            self.stdout.write(f"{pump.queue}: received {s.received}, handled {s.succeeded}, retried {s.retried}, "
                              f"to error {s.errored}, expired {s.expired}, poison {s.poison}, "
                              f"duplicates {s.duplicates}")

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
