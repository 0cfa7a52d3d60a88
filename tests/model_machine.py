"""The model-based test's state machine (Hypothesis ``RuleBasedStateMachine``), shared by
tests/test_model_based.py (a bounded profile) and ``python -m benchmarks soak`` (the
long one).

Rules send messages (one, many, delayed, with and without explicit ids and TTLs, in a
transaction that commits or rolls back), run pump steps on two "processes" (threads
with connections of their own, pumps of different batch sizes), run delayed-mover
steps, push a pump onto its chunked path, let time pass, and — on PostgreSQL — kill a
process's connection with ``pg_terminate_backend`` between steps.  After every step
the invariants of tests/model_checks.py must hold; at the end of each example the
queue must drain within a bounded number of steps (no connection kills then) and every
message be where its plan says.  A failing example prints as the rule calls that
reproduce it.

The machine needs a :class:`World` (queues, processes) set on the class by its runner.
"""
from __future__ import annotations

import datetime as dt
import functools
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from django.db import connections, transaction
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.conf import get_settings
from core.scheduling import delayed_store
from core.transport import Transport
from tests.model_checks import final_violations, snapshot, violations
from tests.model_limits import LimitedHandler, LimitedRules
from tests.model_faults import FOREIGN_ROWS, REFUSED_RECORD_TYPE, insert_readable_foreign_row
from tests.model_support import (BATCH_PLANS, EXCLUDED, LEDGER, POISON_HEADERS, TASK_PLANS, WORK_PLANS, Handlers, Model,
                                 Proc, Sent, clear_outbox, db_now, insert_foreign_row, kill_backend)

#: Hypothesis profile for the machine: SLUICE_HYPOTHESIS_PROFILE (default: bounded).
PROFILE_ENV = "SLUICE_HYPOTHESIS_PROFILE"
BOUNDED, SOAK = "sluice-bounded", "sluice-soak"
_common = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False,
               report_multiple_bugs=False)
# make test: 20 examples of up to 30 steps, under a minute per database on two busy cores;
# the budget at which each mutation of docs/guarantees.md's table was caught in 3 runs of 3
# (10 × 25 caught two of them in half the runs).  A random seed each run, on purpose: every
# make test searches somewhere new.
settings.register_profile(BOUNDED, max_examples=int(os.environ.get("SLUICE_MODEL_EXAMPLES", "20")),
                          stateful_step_count=int(os.environ.get("SLUICE_MODEL_STEPS", "30")), **_common)
# make soak: examples until the time is up (benchmarks/soak.py stops the run).
settings.register_profile(SOAK, max_examples=100_000, stateful_step_count=60, **_common)

#: Drain at the end of an example: rounds of (mover step, pump steps until short), then a
#: short sleep.  Enough for every plan to finish its retries (a delayed retry waits 0.2 s)
#: many times over; the queue is stuck once STUCK_ROUNDS rounds in a row changed nothing
#: while nothing waited in the delayed store.
DRAIN_ROUNDS = 60
DRAIN_PUMP_STEPS = 50
STUCK_ROUNDS = 5

POISON_PLANS = [plan for plan in POISON_HEADERS if plan not in EXCLUDED]
TTLS = st.sampled_from([None, None, None, 1.0, 30.0])
IDS = st.sampled_from([None] if "fixed_ids" in EXCLUDED else [None, None, "fixed-1"])
#: A producer's correlation id: the handler's sends must carry it on (or the parent's id).
CORRELATIONS = st.sampled_from([None, None, "corr-1"])
FOREIGN_PLANS = [plan for plan in FOREIGN_ROWS if plan not in EXCLUDED]


def profile() -> settings:
    return settings.get_profile(os.environ.get(PROFILE_ENV, BOUNDED))


def limit_shrinking(seconds: float) -> None:
    """Hypothesis shrinks a failure for up to 5 minutes; an example here takes seconds
    (its drain), so a failure would meet pytest's 300 s timeout before it printed its
    reproduction.  No setting offers this: the engine's module constant (left alone if
    a Hypothesis release moves it)."""
    from hypothesis.internal.conjecture import engine

    if hasattr(engine, "MAX_SHRINKING_SECONDS"):
        engine.MAX_SHRINKING_SECONDS = seconds


def traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Keep the rule calls of the running example in ``self.trace``: a violation prints
    them, which matters when Hypothesis cannot (a concurrent step's failure that does not
    replay exactly is reported as "flaky", without its rule calls)."""
    @functools.wraps(fn)
    def call(self: "SluiceMachine", **kwargs: Any) -> Any:
        self.trace.append(f"{fn.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        return fn(self, **kwargs)
    return call


@dataclass
class World:
    """What the examples share: the queue the pumps serve, the queue their handlers send
    to, two processes, and whether connections can be killed (PostgreSQL)."""

    queue: str
    out: str
    procs: dict[str, Proc]
    can_kill: bool
    #: Django tasks are enqueued to ``queue`` too (TASKS names Sluice's backend with it).
    tasks: bool = False
    #: A limited queue's handler (tests/model_limits.py), or None.
    limited: LimitedHandler | None = None


class SluiceMachine(LimitedRules, RuleBasedStateMachine):
    world: ClassVar[World]
    #: Totals over every example (benchmarks/soak.py reports them).
    totals: ClassVar[Counter] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.transport = Transport()
        self.violated = False
        self.trace: list[str] = []
        self.outbox = False
        SluiceMachine.totals["examples"] += 1

    # -- set-up and tear-down -----------------------------------------------------------
    @initialize(batch_a=st.sampled_from([1, 3, 8, 100]), batch_b=st.sampled_from([2, 100]),
                outbox=st.booleans(), plans=st.permutations([p for p in WORK_PLANS if p != "refused_record"]),
                sweep=st.booleans())
    @traced
    def start(self, batch_a: int, batch_b: int, outbox: bool, plans: list[str], sweep: bool) -> None:
        """Processes A and B in the default transaction mode; with ``outbox``, a third,
        C, in outbox mode (its handlers' sends stored with the receive, dispatched after)."""
        self._clear()
        handlers = Handlers(self.world.queue, self.world.out, self.model, tasks=self.world.tasks)
        self.world.procs["A"].start(self.world.queue, handlers, batch_a, limited=self.world.limited)
        self.world.procs["B"].start(self.world.queue, handlers, batch_b, limited=self.world.limited)
        self.outbox = outbox
        if outbox:
            self.world.procs["C"].start(self.world.queue, handlers, batch_a, mode="outbox")
        self._sweep(plans, sweep)

    def _sweep(self, plans: list[str], sweep: bool) -> None:
        """(Part of start: initialize rules run in any order, and start clears the queues.)
        Most examples begin with one message of every plan, in random order: a short
        run finds a mutation on a rare plan's path every time (with 13 plans, a rule's
        draw alone missed inner_rollback in whole runs)."""
        if sweep:
            bodies = [self._sent(plan, False, None) for plan in plans]
            self._timed([b["k"] for b in bodies], lambda: self.transport.send_many(
                self.world.queue, bodies, message_type="Work"))
            self._timed([], lambda: self.transport.send(self.world.queue, self._sent("refused_record", False, None),
                                                        message_type=REFUSED_RECORD_TYPE))

    def _message_id(self, given: str | None) -> str | None:
        """An explicit id as given — unless process C runs: the outbox skips a message whose
        id it processed already (by design), so there every explicit id is unique."""
        return f"{given}-{uuid.uuid4().hex[:12]}" if given is not None and self.outbox else given

    def _clear(self) -> None:
        w = self.world
        for name in (w.queue, w.out, get_settings().ERROR_QUEUE, *([w.limited.queue] if w.limited else [])):
            self.transport.purge(name)
        if w.limited is not None:
            w.limited.reset()
        store = delayed_store()
        for message in store.list(100_000)[0]:
            store.delete(message.id)
        with connections["default"].cursor() as cursor:
            cursor.execute(f"DELETE FROM {LEDGER}")
        clear_outbox()

    def teardown(self) -> None:
        try:
            if not self.violated:
                self._drain_and_check()
        finally:
            for proc in self.world.procs.values():
                proc.stop_loops()

    def _drain_and_check(self) -> None:
        """Nothing stuck: with no more faults, the queue and the delayed store empty within
        DRAIN_ROUNDS rounds; then every message is where its plan says."""
        self.trace.append("teardown()  # the drain: no more faults")
        a = self.world.procs["A"]
        last, unchanged = None, 0
        for _ in range(DRAIN_ROUNDS):
            self._step(a, "mover")
            for _ in range(DRAIN_PUMP_STEPS):
                if self._step(a, "pump") > 0:
                    break
            snap = self._check()
            if not any(snap.queued.values()) and not any(snap.stored.values()):
                break
            # (a handler that killed its connection is progress too: the batch rolled back)
            state = (snap.queued, snap.stored, dict(snap.ledger), dict(snap.errors), dict(self.model.raises),
                     dict(self.model.kills))
            unchanged = unchanged + 1 if state == last and not any(snap.stored.values()) else 0
            if unchanged >= STUCK_ROUNDS:
                break
            last = state
            time.sleep(0.1)
        self._fail_on(final_violations(self.model, self._check()), "after the drain")
        self._drain_limited()

    # -- producers ------------------------------------------------------------------------
    def _sent(self, plan: str, batch: bool, ttl: float | None) -> dict:
        if plan == "refused_trigger" and self.outbox:
            # Outbox mode stores sends and dispatches them after the commit: a refusal there
            # is phase 2's (the record stays undispatched), not the message's failure.
            plan = "refused_long"
        key = self.model.next_key()
        self.model.sent[key] = Sent(key, plan, batch, ttl)
        SluiceMachine.totals["messages"] += 1
        return {"k": key, "b": plan}

    def _timed(self, keys: list[str], send: Callable[[], Any]) -> None:
        """``send()``, with the database clock on either side kept: each message's
        original expiry lies between them plus its TTL (tests/model_checks.py)."""
        before = db_now()
        send()
        after = db_now()
        for key in keys:
            self.model.sent[key].sent_between = (before, after)

    @rule(plan=st.sampled_from(WORK_PLANS), ttl=TTLS, message_id=IDS, correlation=CORRELATIONS)
    @traced
    def send(self, plan: str, ttl: float | None, message_id: str | None, correlation: str | None) -> None:
        body = self._sent(plan, False, ttl)
        kind = REFUSED_RECORD_TYPE if plan == "refused_record" else "Work"
        self._timed([body["k"]], lambda: self.transport.send(
            self.world.queue, body, message_type=kind, ttl=ttl, message_id=self._message_id(message_id),
            correlation_id=correlation))

    @precondition(lambda self: self.world.can_kill and "killed_once" not in EXCLUDED)
    @rule()
    @traced
    def send_killed_once(self) -> None:
        """A message whose handler kills its own connection on its first run (tests/model_faults.py)."""
        self.transport.send(self.world.queue, self._sent("killed_once", False, None), message_type="Work")

    @precondition(lambda self: FOREIGN_PLANS)
    @rule(plan=st.sampled_from(FOREIGN_PLANS or ["-"]))
    @traced
    def send_foreign_readable(self, plan: str) -> None:
        """A readable row another system wrote, with headers Sluice could not write back as they are."""
        insert_readable_foreign_row(self.world.queue, self._sent(plan, False, None)["k"], plan)

    @rule(plans=st.lists(st.sampled_from(BATCH_PLANS), min_size=1, max_size=5), batch=st.booleans(), ttl=TTLS,
          message_id=IDS)
    @traced
    def send_many(self, plans: list[str], batch: bool, ttl: float | None, message_id: str | None) -> None:
        bodies = [self._sent(plan, batch, ttl) for plan in plans]
        # send_many(message_id=X) gives every message of the call the id X: with process C
        # running, the outbox would rightly treat all but the first it handles as copies of
        # one message (soak run of 2026-11-26, "m6 (ok): lost").  Shared ids are exercised
        # in the default mode only.
        shared = None if self.outbox and len(bodies) > 1 else self._message_id(message_id)
        self._timed([body["k"] for body in bodies], lambda: self.transport.send_many(
            self.world.queue, bodies, message_type="Batch" if batch else "Work", ttl=ttl, message_id=shared))

    @rule(plans=st.lists(st.sampled_from(BATCH_PLANS), min_size=1, max_size=3), batch=st.booleans(),
          delay=st.sampled_from([0.2, 0.6]), ttl=TTLS)
    @traced
    def send_delayed(self, plans: list[str], batch: bool, delay: float, ttl: float | None) -> None:
        """Delayed sends (no explicit id: the store keeps one message per id by design;
        the TTL starts when the mover puts a message in its queue)."""
        earliest = db_now() + dt.timedelta(seconds=delay)
        bodies = [self._sent(plan, batch, ttl) for plan in plans]
        for body in bodies:
            self.model.sent[body["k"]].earliest = earliest
        kind = "Batch" if batch else "Work"
        if len(bodies) == 1:
            self.transport.send(self.world.queue, bodies[0], message_type=kind, delay=delay, ttl=ttl)
        else:
            self.transport.send_many(self.world.queue, bodies, message_type=kind, delay=delay, ttl=ttl)

    @precondition(lambda self: POISON_PLANS)
    @rule(plan=st.sampled_from(POISON_PLANS or ["-"]))
    @traced
    def send_foreign_row(self, plan: str) -> None:
        """A row another system wrote, with headers Sluice cannot read."""
        insert_foreign_row(self.world.queue, self._sent(plan, False, None)["k"], plan)

    @rule(plans=st.lists(st.sampled_from(BATCH_PLANS), min_size=1, max_size=3))
    @traced
    def send_rolled_back(self, plans: list[str]) -> None:
        """Sends inside a transaction the producer rolls back: they must never exist."""
        bodies = [self._sent(plan, False, None) for plan in plans]
        for body in bodies:
            self.model.sent[body["k"]].rolled_back = True
        try:
            with transaction.atomic():
                self.transport.send_many(self.world.queue, bodies, message_type="Work")
                raise _Abandon()
        except _Abandon:
            pass

    def _task(self, plan: str):
        from tests.task_funcs import model_work

        body = self._sent(plan, False, None)
        return body["k"], model_work.using(queue_name=self.world.queue)

    @precondition(lambda self: self.world.tasks)
    @rule(plan=st.sampled_from(TASK_PLANS))
    @traced
    def enqueue_task(self, plan: str) -> None:
        """A Django task through Sluice's backend (core.tasks): its run is checked like a Work
        message's, and its result row once drained."""
        key, work = self._task(plan)
        self.model.sent[key].task_id = work.enqueue(k=key, b=plan).id
        SluiceMachine.totals["tasks"] += 1

    @precondition(lambda self: self.world.tasks)
    @rule(plan=st.sampled_from(TASK_PLANS))
    @traced
    def enqueue_task_rolled_back(self, plan: str) -> None:
        """A task enqueued in a transaction that rolls back: no run, no message, no result."""
        key, work = self._task(plan)
        self.model.sent[key].rolled_back = True
        try:
            with transaction.atomic():
                self.model.sent[key].task_id = work.enqueue(k=key, b=plan).id
                raise _Abandon()
        except _Abandon:
            pass

    # -- consumers and faults -------------------------------------------------------------------
    @rule(proc=st.sampled_from(["A", "B", "C"]))
    @traced
    def pump_step(self, proc: str) -> None:
        if proc == "C" and not self.outbox:
            proc = "A"  # (no process C in this example)
        self._step(self.world.procs[proc], "pump")

    @precondition(lambda self: "concurrent" not in EXCLUDED)
    @rule(times=st.integers(1, 4))
    @traced
    def pumps_at_once(self, times: int) -> None:
        """Both processes' pumps step at the same time (the only rule whose interleaving
        Hypothesis cannot replay exactly: a failure found here may shrink as "flaky")."""
        self._steps([(self.world.procs["A"], "pump", times), (self.world.procs["B"], "pump", times)])

    @rule(proc=st.sampled_from(["A", "B"]))
    @traced
    def mover_step(self, proc: str) -> None:
        self._step(self.world.procs[proc], "mover")

    @rule(proc=st.sampled_from(["A", "B"]))
    @traced
    def chunked_next(self, proc: str) -> None:
        """The pump's next batch takes the chunked path (as after a failure)."""
        sizes = getattr(self.world.procs[proc].pump, "chunk_size", None)  # core.receive.chunks.ChunkSize
        if sizes is not None:
            self.world.procs[proc].call(lambda: sizes.after(1, 1))

    @rule(seconds=st.sampled_from([0.1, 0.4]))
    @traced
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    @precondition(lambda self: self.world.can_kill)
    @rule(proc=st.sampled_from(["A", "B"]))
    @traced
    def kill_connection(self, proc: str) -> None:
        pid = self.world.procs[proc].backend_pid()
        if pid is not None and kill_backend(pid):
            SluiceMachine.totals["kills"] += 1

    def _step(self, proc: Proc, loop: str) -> float:
        return self._steps([(proc, loop, 1)])[0]

    def _steps(self, work: list[tuple[Proc, str, int]]) -> list[float]:
        """Run steps on processes at once; the wait each returned."""
        self.model.step_started = db_now()
        self.model.step_no += 1
        SluiceMachine.totals["steps"] += sum(times for _, _, times in work)
        futures = [(proc, loop, proc.step(loop, times)) for proc, loop, times in work]
        waits, found = [], []
        for proc, loop, future in futures:
            try:
                waits.append(future.result(120))
            except Exception as exc:
                found.append(f"a {loop} step of process {proc.name} raised {type(exc).__name__}: {exc}")
        self._fail_on(found, "")
        return waits

    # -- the invariants ----------------------------------------------------------------------
    @invariant()
    def invariants_hold(self) -> None:
        self._check()

    def _check(self):
        snap = snapshot(self.world.queue, self.world.out, self.model)
        self._fail_on(violations(self.model, snap), "")
        return snap

    def _fail_on(self, found: list[str], when: str) -> None:
        if found:
            self.violated = True
            SluiceMachine.totals["violations"] += 1
            raise AssertionError(f"{len(found)} violation(s){' ' + when if when else ''}:\n  "
                                 + "\n  ".join(found[:20]) + "\nafter the rule calls:\n  state."
                                 + "\n  state.".join(self.trace[-60:]))


class _Abandon(Exception):
    """Rolls a producer's transaction back."""
