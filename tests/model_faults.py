"""Faults the model-based test (tests/model_machine.py) injects that Sluice's own
``send()`` cannot produce: refusals the database makes, rows another system wrote with
headers Sluice reads but could not write back as they are, and a connection killed
inside a handler (issue 34).

- ``refused_trigger``: the handler sends a child whose CorrelationId a trigger on the
  out queue refuses.  ``send()`` validates nothing here (the value is valid), so the
  refusal comes at the chunk's flush: the chunk's refusal path
  (core.receive.chunks._find_refused) must fail this message alone.
- ``refused_record``: a message of type :data:`REFUSED_RECORD_TYPE` whose handler
  always raises; a trigger on the model queue refuses its immediate retry's re-insert,
  so recording its failure is refused and the last-resort path
  (core.receive.last_resort) must set it aside, raw, with ``Sluice.PoisonReason``.
- ``foreign_surrogate_ok`` / ``foreign_surrogate_raise``: a foreign row whose headers
  carry lone surrogates (valid JSON, ``"\\ud800"``); the first handled (with sends that
  inherit the surrogate conversation id), the second through its retries to the error queue.
- ``foreign_longcorr_raise``: a foreign row with a 300-character CorrelationId header
  (its column NULL) and a failing handler: the retry must not copy it into the column.
- ``killed_once`` (PostgreSQL): the handler terminates its own connection on its first
  run, mid-transaction; the batch rolls back uncounted and the message is handled later.
"""
from __future__ import annotations

import json
import uuid

from django.db import connections

from core.db import StatementCursor
from core.messages import Headers
from core.queues import dialect

#: The CorrelationId the out queue's trigger refuses (valid for send(): only the database refuses it).
REFUSE_CORRELATION = "model-refuse-me"
#: The message type whose failure records the model queue's trigger refuses.
REFUSED_RECORD_TYPE = "RefusedRecord"
LONE = "\ud800"
#: Readable foreign rows (rule ``send_foreign_readable``): plan → extra headers, CorrelationId column.
FOREIGN_ROWS = {
    "foreign_surrogate_ok": {Headers.CONVERSATION_ID: f"conv-{LONE}", "Foreign.Note": f"a {LONE} b"},
    "foreign_surrogate_raise": {Headers.CONVERSATION_ID: f"conv-{LONE}", "Foreign.Note": f"a {LONE} b"},
    "foreign_longcorr_raise": {Headers.CORRELATION_ID: "c" * 300},
}
#: What each fault plan's handler does, as one of tests/model_support.py's plain plans.
BEHAVES_AS = {"foreign_surrogate_ok": "sends", "foreign_surrogate_raise": "raise",
              "foreign_longcorr_raise": "raise", "refused_record": "raise", "killed_once": "ok"}


def behaves_as(plan: str) -> str:
    return BEHAVES_AS.get(plan, plan)


def _trigger(table: str, name: str, condition: str, alias: str = "default") -> None:
    """A BEFORE INSERT trigger on ``table`` refusing rows where ``condition`` (on NEW)
    holds.  Test set-up only, so the two vendors' syntax lives here, not in core/dialects
    (the same as tests/test_guarantees_pump.py's refuse_correlation_id)."""
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            cursor.execute(f"""CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$
                BEGIN IF {condition} THEN RAISE EXCEPTION 'refused by the model''s trigger'; END IF;
                RETURN NEW; END $$ LANGUAGE plpgsql""")
            cursor.execute(f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()")
        else:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
            cursor.execute(f"""CREATE TRIGGER {name} BEFORE INSERT ON {table} WHEN {condition}
                BEGIN SELECT RAISE(ABORT, 'refused by the model''s trigger'); END""")


def install_refusals(queue: str, out: str) -> None:
    """The two triggers (module doc): on ``out``, a child with :data:`REFUSE_CORRELATION`;
    on ``queue``, a :data:`REFUSED_RECORD_TYPE` row that carries a failure count (its
    retry: the first send has none)."""
    d = dialect("default")
    _trigger(d.table(out), f"model_refuse_{out}", f"NEW.\"CorrelationId\" = '{REFUSE_CORRELATION}'")
    _trigger(d.table(queue), f"model_refuse_{queue}",
             f"NEW.\"Headers\" LIKE '%{REFUSED_RECORD_TYPE}%' AND NEW.\"Headers\" LIKE '%{Headers.FAILED_ATTEMPTS}%'")


def insert_readable_foreign_row(queue: str, key: str, plan: str) -> None:
    """A row another system wrote, readable (a JSON object of strings) but holding what
    Sluice could not write back as it is (:data:`FOREIGN_ROWS`)."""
    headers = {Headers.MESSAGE_ID: str(uuid.uuid4()), Headers.ENCLOSED_MESSAGE_TYPES: "Work", **FOREIGN_ROWS[plan]}
    text = json.dumps(headers)  # ensure_ascii: a lone surrogate travels as "\ud800", valid JSON
    row = [headers[Headers.MESSAGE_ID], None, None, None, text, json.dumps({"k": key, "b": plan}).encode()]
    with StatementCursor("default") as cursor:
        cursor.execute(dialect("default").insert_with_expires(queue), row)


class Killed(Exception):
    """The handler's own connection was terminated under it (plan ``killed_once``)."""


def kill_own_connection(using: str) -> None:
    """Terminate this handler's connection from inside its transaction (PostgreSQL): the
    server drops it as a crash or a network failure would, mid-transaction."""
    try:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    except Exception as exc:
        raise Killed(str(exc)) from exc
    raise Killed("pg_terminate_backend returned")
