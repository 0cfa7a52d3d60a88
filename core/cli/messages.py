"""`sluice send`, `sluice peek` and `sluice receive`, and the message JSON they print."""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

from core.cli.base import CommandError, Group, command_group, parse_header, positive
from core.receive.consumer import receive_one
from core.messages import Headers, Message
from core.transport import Transport


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


@command_group
class MessageCommands(Group):
    def add_to(self, sub) -> None:
        send = self.handles(sub.add_parser("send", help="send one message; prints its id"), self.send)
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

        peek = self.handles(sub.add_parser("peek", help="look at messages in FIFO order without taking them"),
                            self.peek)
        peek.add_argument("queue")
        peek.add_argument("--limit", type=int, default=20)
        peek.add_argument("--json", action="store_true")

        receive = self.handles(sub.add_parser("receive", help="take the next message off a queue for good"),
                               self.receive)
        receive.add_argument("queue")
        receive.add_argument("--json", action="store_true")

    def send(self, options: dict[str, Any]) -> None:
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

    def peek(self, options: dict[str, Any]) -> None:
        messages = Transport().browse(options["queue"], limit=positive(options))
        if options["json"]:
            self.stdout.write(json.dumps([message_json(m) for m in messages]))
            return
        for m in messages:
            data = message_json(m)
            body = data["body"] if data["body"] is not None else f"<{len(m.body)} bytes, base64 in --json>"
            flag = " EXPIRED" if m.expired else (" POISON" if m.poison else "")
            self.stdout.write(f"{data['id']}  {data['type'] or '-'}{flag}  expires={data['expires'] or '-'}\n  {body[:200]}")

    def receive(self, options: dict[str, Any]) -> None:
        message = receive_one(options["queue"])
        if options["json"]:
            self.stdout.write(json.dumps(message_json(message) if message else None))
        elif message is None:
            self.stdout.write("(queue is empty)")
        else:
            self.stdout.write(json.dumps(message_json(message), indent=2))
