"""The world the model-based test drives (tests/model_machine.py): a ledger table the
handlers write business rows to, handlers whose behaviour each message's body chooses,
"processes" (threads with connections of their own) that run pump and mover steps,
and a plain Python model of what must be true, checked against the database.

A message's body is ``{"k": key, "b": plan}``.  Plans (type ``Work``, one-message
handler; type ``Batch``, a batch handler, takes the first five):

- ``ok``: a ledger row;  ``sends``: a ledger row and two sends (the batch handler: one);
- ``raise``: always raises;  ``flakyN``: raises on its first N runs, then as ``ok``;
- ``inner_commit``: a ledger row and a send inside an inner ``atomic()`` that commits;
- ``inner_rollback``: a ledger row, a send inside an inner ``atomic()`` that rolls back
  (the handler catches its exception), then a send after it: only the second may exist;
- ``refused_long`` / ``refused_nul``: a ledger row and a send the database refuses (a
  300-character correlation id / a NUL in the reply-to address): the message must fail
  on its own, through its retries to the error queue, and block nothing;
- ``delayed_child``: a ledger row and a delayed send;
- ``refused_trigger``, ``refused_record``, the foreign rows and ``killed_once``: faults
  Sluice's ``send()`` cannot make (tests/model_faults.py).

The model counts each handler's raises in memory (``raises``): that is the number of
failed handler runs, whichever pump ran them, which the message's
``Sluice.TotalFailedAttempts`` must equal when it is finally handled.
"""
from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import os
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from django.db import connections, transaction

from core.db import StatementCursor
from core.delayed import DelayedMover
from core.handlers import HandlerRegistry
from core.runtime.loops import drop_broken_connections
from core.messages import Headers, Message
from core.receive.pump import MessagePump
from core.outgoing import valid_correlation_id
from core.queues import dialect
from tests.model_faults import REFUSE_CORRELATION, REFUSED_RECORD_TYPE, Killed, behaves_as, kill_own_connection

LEDGER = "sluice_model_ledger"
#: Immediate and delayed retries the pumps run with; a message fails LIMIT times at most.
IMMEDIATE_RETRIES = 2
DELAYED_RETRIES = 1
LIMIT = (IMMEDIATE_RETRIES + 1) * (DELAYED_RETRIES + 1)
#: What a delayed retry waits (SLUICE_DELAYED_RETRY_INCREASE during the test).
DELAYED_RETRY_INCREASE = 0.2
#: Plans left out (comma-separated SLUICE_MODEL_EXCLUDE): to look past a defect already found.
EXCLUDED = {name for name in os.environ.get("SLUICE_MODEL_EXCLUDE", "").split(",") if name}
WORK_PLANS = ("ok", "sends", "raise", "flaky1", "flaky3", f"flaky{LIMIT}", "inner_commit", "inner_rollback",
              "refused_long", "refused_nul", "delayed_child", "refused_trigger", "refused_record")
BATCH_PLANS = ("ok", "sends", "raise", "flaky1", "flaky3", f"flaky{LIMIT}")
#: Rows another system wrote, whose Headers are no JSON object of strings (producer rule
#: ``send_foreign_row``): poison, to the error queue at once, never to a handler.
POISON_HEADERS = {"poison_text": "not json at all", "poison_nested": "[" * 100_000 + "]" * 100_000}
WORK_PLANS = tuple(plan for plan in WORK_PLANS if plan not in EXCLUDED)
BATCH_PLANS = tuple(plan for plan in BATCH_PLANS if plan not in EXCLUDED)
#: The children a handled message's business work sends (by child name), per plan.
CHILDREN = {"sends": ("c0", "c1"), "inner_commit": ("c0",), "inner_rollback": ("c1",), "delayed_child": ("c0",)}
BATCH_CHILDREN = {"sends": ("c0",)}


class PlannedFailure(RuntimeError):
    """A handler failing because its message's plan says so."""


class _Undo(Exception):
    """Rolls an inner atomic() block back; the handler catches it."""


def flaky_runs(plan: str) -> int:
    """How many runs of ``plan`` fail before it succeeds (LIMIT + 1: never succeeds)."""
    plan = behaves_as(plan)
    if plan.startswith("flaky"):
        return int(plan[5:])
    return LIMIT + 1 if plan in ("raise", "refused_long", "refused_nul", "refused_trigger") else 0


def fails_for_good(plan: str) -> bool:
    return flaky_runs(plan) >= LIMIT or plan in POISON_HEADERS


# -- the database side ------------------------------------------------------------------
def db_now(alias: str = "default") -> dt.datetime:
    """The database's clock (the expression Sluice computes Expires and due times with)."""
    d = dialect(alias)
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])
        return d.to_datetime(cursor.fetchone()[0])


def insert_foreign_row(queue: str, key: str, plan: str) -> None:
    """A row as another system might write it: body ``{"k", "b"}``, Headers per ``plan``."""
    d = dialect("default")
    row = [str(uuid.uuid4()), None, None, None, POISON_HEADERS[plan], json.dumps({"k": key, "b": plan}).encode()]
    with StatementCursor("default") as cursor:
        cursor.execute(d.insert_with_expires(queue), row)


def queued_bodies(queue: str) -> list[dict]:
    """The bodies of a queue's rows, read raw (a row whose headers cannot be read is counted too)."""
    d = dialect("default")
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT {d.quote('Body')} FROM {d.table(queue)}")
        return [model_body(json.loads(bytes(row[0]))) for row in cursor.fetchall()]


def model_body(body: dict) -> dict:
    """``{"k", "b"}`` of a message, or of a Django task's message (its keyword arguments)."""
    return body if "k" in body else body["kwargs"]


def clear_outbox(alias: str = "default") -> None:
    """Forget every outbox record: ids the outbox saw in an earlier example must not make
    this one's messages duplicates."""
    from core.outbox import Outbox

    store = Outbox(alias).store
    with connections[alias].cursor() as cursor:
        cursor.execute(f"DELETE FROM {store.dialect.table(store.table)}")


def create_ledger(alias: str = "default") -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {LEDGER}")
        cursor.execute(f"CREATE TABLE {LEDGER} (k varchar(64) NOT NULL, attempt integer NOT NULL)")


def drop_ledger(alias: str = "default") -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {LEDGER}")


@dataclass
class Run:
    """One handler run of one message, as the handler saw it."""

    key: str
    at: dt.datetime              # the database clock when the handler started
    step_started: dt.datetime    # the database clock before the step that ran it began
    expires: dt.datetime | None  # the row's Expires
    delayed_retries: int = 0     # NServiceBus.Retries on the row (a delayed retry restarts the TTL)


@dataclass
class Sent:
    key: str
    plan: str
    batch: bool
    ttl: float | None
    #: A lower bound of the due time of a delayed send (the database clock before the send + delay).
    earliest: dt.datetime | None = None
    rolled_back: bool = False
    #: A Django task's result id (None: a plain message).
    task_id: str | None = None
    #: The database clock just before and just after the send: its ORIGINAL Expires lies
    #: between these plus the TTL (None: delayed or foreign, whose TTL starts later).
    sent_between: tuple[dt.datetime, dt.datetime] | None = None


@dataclass
class Model:
    """What was sent and what the handlers did, in memory."""

    sent: dict[str, Sent] = field(default_factory=dict)
    raises: Counter = field(default_factory=Counter)
    runs: list[Run] = field(default_factory=list)
    step_started: dt.datetime | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Handler runs that killed their own connection (plan killed_once), by key.
    kills: Counter = field(default_factory=Counter)
    #: The step being run (SluiceMachine._steps numbers them) and the steps in which a
    #: handler raised: a kill there could roll back a failure count the model already
    #: counted, so killed_once kills only in a step where nothing raised yet.
    step_no: int = 0
    raised_in: set = field(default_factory=set)
    #: key → what its handler's sends must carry: (RelatedTo, CorrelationId or None when
    #: not inherited, ConversationId or None), from the message as the handler saw it.
    parents: dict = field(default_factory=dict)

    def next_key(self) -> str:
        return f"m{len(self.sent)}"

    def __repr__(self) -> str:  # short: Hypothesis prints it with a failing example
        return f"Model({', '.join(f'{k}:{s.plan}' for k, s in self.sent.items())})"


# -- the handlers ------------------------------------------------------------------------
#: The Handlers whose model Django tasks record into (tests/task_funcs.py's model_work).
_task_handlers: list["Handlers"] = []


def task_handlers() -> "Handlers":
    return _task_handlers[-1]


#: Plans a task may have (a task sends nothing: no children).
TASK_PLANS = tuple(plan for plan in ("ok", "raise", "flaky1", "flaky3", f"flaky{LIMIT}") if plan not in EXCLUDED)


class Handlers:
    """The handlers for one queue, recording into a :class:`Model`; with ``tasks``, also
    Django tasks enqueued to that queue (Sluice's task backend, core.tasks)."""

    def __init__(self, queue: str, out: str, model: Model, tasks: bool = False) -> None:
        self.queue, self.out, self.model = queue, out, model
        self.registry = HandlerRegistry()
        self.registry.register(queue, "Work", self.work)
        self.registry.register(queue, "Batch", self.batch, batch=True)
        self.registry.register(queue, REFUSED_RECORD_TYPE, self.work)
        if tasks:
            from core.tasks.worker import register

            register(self.registry)
            _task_handlers.append(self)

    def task_work(self, key: str, plan: str, attempt: int) -> None:
        """A task's run: as a Work message's, its ledger row carrying the failed attempts before it."""
        with self.model.lock:
            self.model.runs.append(Run(key, db_now(), self.model.step_started, None))
        if plan.startswith("flaky") and self._will_fail(key, plan) or plan == "raise":
            self._fail(key, f"planned failure of task {plan}")
        with connections["default"].cursor() as cursor:
            cursor.execute(f"INSERT INTO {LEDGER} (k, attempt) VALUES (%s, %s)", [key, attempt - 1])

    def _record(self, message: Message, using: str) -> str:
        key = message.json()["k"]
        with self.model.lock:
            self.model.runs.append(Run(key, db_now(using), self.model.step_started, message.expires,
                                       message.delayed_retries))
            headers = message.headers
            inherited = headers.get(Headers.CORRELATION_ID) or message.correlation_id
            self.model.parents[key] = (headers.get(Headers.MESSAGE_ID, message.id),
                                       inherited if inherited and valid_correlation_id(inherited) else None,
                                       headers.get(Headers.CONVERSATION_ID))
        return key

    def _fail(self, key: str, why: str) -> None:
        with self.model.lock:
            self.model.raises[key] += 1
            self.model.raised_in.add(self.model.step_no)
        raise PlannedFailure(f"{key}: {why}")

    def _will_fail(self, key: str, plan: str) -> bool:
        return self.model.raises[key] < flaky_runs(plan)

    def _ledger(self, using: str, key: str, message: Message) -> None:
        with connections[using].cursor() as cursor:
            cursor.execute(f"INSERT INTO {LEDGER} (k, attempt) VALUES (%s, %s)",
                           [key, message.total_failed_attempts])

    def work(self, message: Message, context: Any) -> None:
        key = self._record(message, context.using)
        plan = message.json()["b"]
        try:
            self._work(key, plan, message, context)
        except (PlannedFailure, Killed):  # (a kill rolls the whole receive back: no failure counted)
            raise
        except Exception:  # a send refused in the handler: a failed run too
            with self.model.lock:
                self.model.raises[key] += 1
                self.model.raised_in.add(self.model.step_no)
            raise

    def _work(self, key: str, plan: str, message: Message, context: Any) -> None:
        if plan == "killed_once":
            with self.model.lock:
                kill = not self.model.kills[key] and self.model.step_no not in self.model.raised_in
                self.model.kills[key] += kill
            if kill:
                kill_own_connection(context.using)
        plan = behaves_as(plan)
        if plan.startswith("flaky") and self._will_fail(key, plan) or plan == "raise":
            self._fail(key, f"planned failure of {plan}")
        self._ledger(context.using, key, message)
        child = {"parent": key}
        if plan == "sends":
            context.send(self.out, {**child, "c": "c0"}, message_type="Child")
            context.send(self.out, {**child, "c": "c1"}, message_type="Child")
        elif plan == "inner_commit":
            with transaction.atomic(using=context.using):
                context.send(self.out, {**child, "c": "c0"}, message_type="Child")
        elif plan == "inner_rollback":
            try:
                with transaction.atomic(using=context.using):
                    context.send(self.out, {**child, "c": "c0"}, message_type="Child")
                    raise _Undo()
            except _Undo:
                pass
            context.send(self.out, {**child, "c": "c1"}, message_type="Child")
        elif plan == "refused_long":
            context.send(self.out, {**child, "c": "c0"}, message_type="Child", correlation_id="x" * 300)
        elif plan == "refused_nul":
            context.send(self.out, {**child, "c": "c0"}, message_type="Child", reply_to="a\x00b")
        elif plan == "refused_trigger":
            context.send(self.out, {**child, "c": "c0"}, message_type="Child", correlation_id=REFUSE_CORRELATION)
        elif plan == "delayed_child":
            context.send(self.out, {**child, "c": "c0"}, message_type="Child", delay=0.3)

    def batch(self, messages: list[Message], context: Any) -> None:
        keys = [self._record(m, context.using) for m in messages]
        plans = [m.json()["b"] for m in messages]
        failing = [k for k, p in zip(keys, plans) if p == "raise" or self._will_fail(k, p)]
        if failing:
            if len(messages) == 1:
                self._fail(keys[0], f"planned failure of {plans[0]} (batch handler)")
            raise PlannedFailure(f"batch of {len(messages)} holds {', '.join(failing)}")  # split, not counted
        for key, plan, message in zip(keys, plans, messages):
            self._ledger(context.using, key, message)
            if plan == "sends":
                context.for_message(message).send(self.out, {"parent": key, "c": "c0"}, message_type="Child")


# -- processes ------------------------------------------------------------------------------
class Proc:
    """A stand-in for a worker process: one thread (so one database connection of its
    own) that runs a pump and a mover, one step at a time, when told to."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"model-{name}")
        self.pump: MessagePump | None = None
        self.mover: DelayedMover | None = None
        self.limited: MessagePump | None = None  # the limited queue's (tests/model_limits.py)

    def call(self, fn: Callable[[], Any], timeout: float = 120) -> Any:
        return self._pool.submit(fn).result(timeout)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        return self._pool.submit(fn)

    def start(self, queue: str, handlers: Handlers, batch_size: int, mode: str = "sends_atomic_with_receive",
              limited: Any = None) -> None:
        """``limited``: the limited queue's handler (tests/model_limits.py), pumped as loop "limited"."""
        def make() -> None:
            self.pump = MessagePump(queue, receive_batch_size=batch_size, concurrency=1, peek_delay=0.1,
                                    immediate_retries=IMMEDIATE_RETRIES, delayed_retries=DELAYED_RETRIES,
                                    handlers=handlers.registry, transaction_mode=mode)
            self.mover = DelayedMover(elect=False, max_sleep=1.0)
            if limited is not None:
                self.limited = MessagePump(limited.queue, receive_batch_size=batch_size, concurrency=1,
                                           peek_delay=0.1, handlers=limited.registry)
        self.call(make)

    def step(self, loop_name: str, times: int = 1) -> concurrent.futures.Future:
        """``times`` steps of the pump or the mover, as core.runtime.loops.ThreadRunner runs them
        (an exception a step lets out is a finding: the runner would only log it); the
        last step's wait."""
        def run() -> float:
            loop = {"pump": self.pump, "mover": self.mover, "limited": self.limited}[loop_name]
            wait = 0.0
            for _ in range(times):
                try:
                    wait = loop.step()
                finally:
                    drop_broken_connections()
            return wait
        return self.submit(run)

    def backend_pid(self) -> int | None:
        """The PostgreSQL backend of this process's connection (None: not connected)."""
        def pid() -> int | None:
            raw = connections["default"].connection
            return None if raw is None or raw.closed else raw.info.backend_pid
        return self.call(pid)

    def stop_loops(self) -> None:
        def close() -> None:
            for loop in (self.pump, self.mover, self.limited):
                if loop is not None:
                    loop.close()
            self.pump = self.mover = self.limited = None
            connections.close_all()
        self.call(close)

    def shutdown(self) -> None:
        self.stop_loops()
        self._pool.shutdown(wait=True)


def kill_backend(pid: int) -> bool:
    """pg_terminate_backend: the connection drops as if the network or server failed it."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        return bool(cursor.fetchone()[0])
