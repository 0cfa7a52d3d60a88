"""The outbox under real process deaths: SIGKILL during the handler, between the commit
and the dispatch, and between the dispatch and marking the record dispatched.

300 ``Relay`` messages go to the demo endpoint, whose handler writes a business row and
sends one message onward to a queue in *another* database (the case the outbox is for).
Worker processes in outbox mode are started one after another, each killing itself at
one kind of fault point with some probability (tests/outbox_faults.py), until the queue
is drained and nothing is left to dispatch.  Then: every business row exactly once,
every outgoing message delivered at least once, and a receiving endpoint with an outbox
turns the copies back into exactly-once processing.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

from core.demo.models import PingRecord
from core.messages import Headers
from core.receive.pump import MessagePump
from core.transport import Transport
from tests.celery_support import clear_delayed
from tests.conftest import OTHER, ROOT, database_url, uses_other_database

MESSAGES = 300
#: Per fault point: the probability of dying each time a process passes it.  Chosen so a
#: worker lives for a few dozen messages (phase 2 runs once per receive batch of 4).
KILL_PROBABILITY = {"in_handler": 0.04, "after_commit": 0.15, "after_dispatch": 0.15}
TIME_LIMIT = 100.0


def run_worker(kill_at: str) -> tuple[int, str]:
    """One worker life: serve the demo queue until it is empty, or until it kills itself."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "SLUICE_OTHER_DATABASE_URL": database_url(OTHER),
        "SLUICE_TRANSACTION_MODE": "outbox",
        "SLUICE_RECEIVE_BATCH_SIZE": "4",
        "SLUICE_PEEK_DELAY": "0.1",
        "SLUICE_OUTBOX_DISPATCHER_INTERVAL": "0.2",
        "SLUICE_OUTBOX_DISPATCHER_GRACE": "0.5",
        "SLUICE_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.run([sys.executable, "-m", "tests.outbox_faults", kill_at, "sluice", "worker", "--queue", "demo",
                           "--concurrency", "2", "--until-empty"], cwd=ROOT, env=env, capture_output=True,
                          timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")


@uses_other_database
def test_killed_workers_lose_nothing_and_duplicates_are_absorbed(demo, outbox, other_outbox, make_other_queue,
                                                                 temp_handlers, error_queue):
    # The workers run the delayed mover: what earlier tests left in the store (due now, for
    # queues since dropped) would end in the error queue.
    clear_delayed()
    remote = make_other_queue("relayed")
    transport = Transport()
    sent = transport.send_many("demo", [{"to": f"{remote}@{OTHER}"} for _ in range(MESSAGES)],
                               message_type="Relay")
    rng = random.Random(4)
    kills: Counter[str] = Counter()
    started = time.monotonic()
    lives = 0
    while True:
        assert time.monotonic() - started < TIME_LIMIT, f"not drained in {TIME_LIMIT} s; kills so far {kills}"
        # Every kind of fault in turn, in a random order each round.
        if lives % len(KILL_PROBABILITY) == 0:
            order = rng.sample(sorted(KILL_PROBABILITY), len(KILL_PROBABILITY))
        point = order[lives % len(KILL_PROBABILITY)]
        lives += 1
        code, output = run_worker(f"{point}:{KILL_PROBABILITY[point]}")
        if code == -signal.SIGKILL:
            assert f"SIGKILL at {point}" in output
            kills[point] += 1
            continue
        assert code == 0, output
        break
    elapsed = time.monotonic() - started
    print(f"{lives} worker lives, kills {dict(kills)}, {elapsed:.1f} s")
    assert all(kills[point] >= 1 for point in KILL_PROBABILITY), kills

    # The sending endpoint: each business row exactly once, nothing left anywhere.
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(sent)
    errors = [m.headers.get(Headers.EXCEPTION_MESSAGE) for m in transport.browse(error_queue)]
    assert transport.counts("demo").total == 0 and not errors, errors
    assert outbox.store.stats().undispatched == 0

    # Every outgoing message arrived at least once; a copy carries the same message id.
    arrived = Transport(OTHER).browse(remote, limit=10 * MESSAGES)
    by_id = {m.headers[Headers.MESSAGE_ID]: m.json()["from"] for m in arrived}
    assert sorted(by_id.values()) == sorted(sent)  # one outgoing message id per incoming message
    copies = len(arrived) - len(by_id)
    assert copies >= 1  # killed between dispatch and mark: the other database got them again

    # The receiving endpoint uses the outbox: the copies are absorbed.
    def receive(message, context):
        PingRecord.objects.using(context.using).create(message_id=message.headers[Headers.MESSAGE_ID])

    temp_handlers(remote, None, receive)
    receiver = MessagePump(remote, using=OTHER, transaction_mode="outbox", peek_delay=0.1)
    try:
        while receiver.step() == 0:
            pass
    finally:
        receiver.close()
    received = list(PingRecord.objects.using(OTHER).values_list("message_id", flat=True))
    assert sorted(received) == sorted(by_id)
    assert receiver.stats.duplicates == copies and receiver.stats.succeeded == MESSAGES
