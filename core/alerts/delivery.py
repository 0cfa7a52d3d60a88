"""Delivering one notification: the handler of the alerts queue (``SLUICE_ALERTS_QUEUE``)
and what follows it.  No target is ever called while a transaction is open: the pump
holds the received message's row locked until its transaction ends, so a call made from
inside the handler would hold that lock for as long as a slow target takes.

Each message names one :class:`AlertDelivery` and an attempt number n.  An attempt:

1. **Claim** — the handler, inside the receive's transaction, moves the delivery to
   ``sending`` (attempt n, deadline ``sending_until`` = the database's now +
   :func:`send_window`) and sends a *check* message to the same queue, delayed to that
   deadline.  No network.  Claim, check and receive commit together, or none does (and
   the message comes again).
2. **Call** — once the transaction holding the claim has committed, the call
   is handed to a small pool of threads (:data:`SENDERS`, so a slow target holds neither
   a transaction nor a pump thread).  There, with no transaction open, it re-arms the
   deadline (the call may have waited for a free thread), makes one HTTP or SMTP attempt
   with a timeout (``SLUICE_ALERTS_DELIVERY_TIMEOUT``, core.alerts.sending), then
3. **Settle** — in one short transaction: ``sent``; or, after a network error, timeout,
   408, 429 or 5xx, ``retrying`` with the next attempt sent as a delayed message
   (``base × 2^(n-1)`` s with full jitter, or the target's ``Retry-After``, both capped at
   ``SLUICE_ALERTS_RETRY_CAP``); or ``failed`` for good (other answers, or the last
   attempt): the alerts page shows it and a ``delivery_failed`` rule alerts on it.
4. **Check** — when the check message comes due and attempt n is still ``sending`` past
   its deadline, the call never settled: its worker was killed, or lost the database,
   between claim and settle.  The check settles attempt n as a retryable failure, so the
   next attempt goes out (a lost attempt counts as one).  A re-armed deadline sends the
   check again for the new one.

Why no notification is lost (at-least-once): from the moment an attempt may be under
way, a committed message exists that will look at it (the check commits with the claim),
and every attempt ends settled or checked.  A notification can arrive twice — the worker
died after the target answered but before the result was stored, or an attempt outran
its deadline — never zero times while attempts remain.  Settling is conditional (only
attempt n, still ``sending``, moves on), so a late result never undoes a newer state;
a late success always counts (the notification reached its target).
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Callable

from django.db import connections, transaction
from django.db.models.functions import Now
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from core.models.alerts import AlertDelivery, DeliveryStatus
from core.alerts.notify import MESSAGE_TYPE
from core.alerts.sending import Attempt, attempt_delivery, backoff, redact
from core.conf import get_settings
from core.db import writer_turn
from core.handlers import HandlerContext, Sender, handlers
from core.messages import Message
from core.transport import Transport

log = logging.getLogger("sluice.alerts")

DONE = (DeliveryStatus.SENT, DeliveryStatus.FAILED, DeliveryStatus.RATE_LIMITED)
#: The type of the messages that look at an attempt once its deadline has passed.
CHECK_TYPE = "Sluice.AlertDeliveryCheck"
#: Calls under way at once per worker process; more wait for a free thread.
SENDERS = 4

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def send_window() -> float:
    """Seconds an attempt may take before it counts as lost.  The timeout bounds each step
    of an SMTP session (connect, greeting, each command), not the session: a few of them,
    and a margin."""
    return 3 * get_settings().ALERTS_DELIVERY_TIMEOUT + 2.0


def senders() -> ThreadPoolExecutor:
    """The process's pool of calling threads (made on first need).  Its threads are joined
    when the interpreter exits, so a graceful stop lets calls under way finish."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="sluice-alert-send")
        return _pool


def after_claim_commits(fn: Callable[[], object], using: str) -> None:
    """Run ``fn`` once the claim made on ``using`` has committed: when the transaction
    open there commits (never, if it rolls back: the claim went with it), at once if none
    is open.  Only the claim's connection counts.  In ``receive_only`` the claim commits
    in a transaction of its own while the receive stays open on another connection; a
    call waiting for the receive too was never made when the receive rolled back (the
    message, received again, is a copy of the claimed attempt), and the attempt counted
    as lost at its check.  The call itself runs on a pool thread, whose connections hold
    no transaction (:func:`no_transaction_open`), so an open receive cannot hold it up."""
    if connections[using].in_atomic_block:
        transaction.on_commit(fn, using=using, robust=True)
    else:
        fn()


def no_transaction_open() -> None:
    """The rule this module keeps, checked where it matters: before a target is called."""
    open_on = [c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block]
    if open_on:
        raise TransactionManagementError(f"alert targets are never called inside a transaction (open on {open_on})")


def deliver(message: Message, context: HandlerContext) -> None:
    """The alerts queue's handler: claim an attempt, or check one (see the module doc)."""
    body = message.json() or {}
    pk, n = body.get("delivery"), int(body.get("attempt", 1))
    if body.get("check"):
        check(pk, n, context)
        return
    window = send_window()
    # A savepoint of the receive's transaction; its own short one where the receive runs
    # apart (receive_only): either way the claim and its check commit together.
    with transaction.atomic(using=context.using):
        claimed = (AlertDelivery.objects.using(context.using).filter(pk=pk, attempts=n - 1).exclude(status__in=DONE)
                   .update(status=DeliveryStatus.SENDING, attempts=n,
                           sending_until=Now() + timedelta(seconds=window)))
        if not claimed:
            return  # finished, deleted, or a copy of an attempt claimed already
        send_check(context, pk, n, window)
    after_claim_commits(lambda: senders().submit(call, pk, n), context.using)


def send_check(sender: Sender, pk: int, n: int, delay: float) -> None:
    sender.send(get_settings().ALERTS_QUEUE, {"delivery": pk, "attempt": n, "check": True},
                message_type=CHECK_TYPE, delay=delay)


def call(pk: int, n: int) -> None:
    """Attempt n of delivery ``pk``, on a pool thread (see the module doc)."""
    using = get_settings().DATABASE
    try:
        with writer_turn(using):
            armed = (AlertDelivery.objects.using(using).filter(pk=pk, attempts=n, status=DeliveryStatus.SENDING)
                     .update(sending_until=Now() + timedelta(seconds=send_window())))
        if not armed:
            return  # its check came first (the call waited past the deadline): the next attempt is on its way
        delivery = AlertDelivery.objects.using(using).select_related("target", "alert", "alert__rule").get(pk=pk)
        no_transaction_open()
        try:
            result = attempt_delivery(delivery)
        except Exception as exc:  # noqa: BLE001 — e.g. an address urllib refuses: this target's failure, for good
            result = Attempt(False, False, None, f"{type(exc).__name__}: {exc}")
        with writer_turn(using), transaction.atomic(using=using):
            settle(delivery, n, result, Transport(using))
    except Exception:  # noqa: BLE001 — e.g. the database went away: the check settles this attempt
        log.exception("alert delivery #%s, attempt %d: not settled; its check will", pk, n)
    finally:
        connections[using].close()  # a pool thread may wait long for its next call


def settle(delivery: AlertDelivery, n: int, result: Attempt, sender: Sender, *, lapsed_only: bool = False) -> None:
    """Store how attempt ``n`` ended, and send the next attempt when it should be retried
    (in the caller's transaction).  Only attempt ``n``, still ``sending`` (and with
    ``lapsed_only`` past its deadline), moves on; a success always counts."""
    s = get_settings()
    rows = AlertDelivery.objects.using(sender.using)
    name = f"{delivery.event} notification #{delivery.pk} to {delivery.target.name}"
    if result.ok:
        if rows.filter(pk=delivery.pk).exclude(status__in=DONE).update(
                status=DeliveryStatus.SENT, last_error="", finished_at=Now(), sending_until=None):
            log.info("%s sent (attempt %d)", name, n)
        return
    error = redact(result.error, delivery.target)[:1000]
    mine = rows.filter(pk=delivery.pk, attempts=n, status=DeliveryStatus.SENDING)
    if lapsed_only:
        mine = mine.filter(sending_until__lte=Now())
    if result.retryable and n < s.ALERTS_DELIVERY_ATTEMPTS:
        wait = backoff(n, result.retry_after)
        if mine.update(status=DeliveryStatus.RETRYING, last_error=error, sending_until=None):
            sender.send(s.ALERTS_QUEUE, {"delivery": delivery.pk, "attempt": n + 1}, message_type=MESSAGE_TYPE,
                        delay=wait)
            log.warning("%s: attempt %d failed (%s); next in %.1f s", name, n, error, wait)
    elif mine.update(status=DeliveryStatus.FAILED, last_error=error, finished_at=Now(), sending_until=None):
        log.error("%s failed for good after %d attempt(s): %s", name, n, error)


def check(pk: int, n: int, context: HandlerContext) -> None:
    """Attempt ``n``'s deadline came: settle it as lost if it is still under way past it;
    look again later if its deadline was re-armed."""
    rows = AlertDelivery.objects.using(context.using)
    delivery = rows.select_related("target").filter(pk=pk, attempts=n, status=DeliveryStatus.SENDING).first()
    if delivery is None:
        return  # settled, or a later attempt began
    lost = Attempt(False, True, None, f"attempt {n} had no result by its deadline: the worker making it "
                                      "stopped or lost the database")
    with transaction.atomic(using=context.using):
        settle(delivery, n, lost, context, lapsed_only=True)
        deadline = (rows.filter(pk=pk, attempts=n, status=DeliveryStatus.SENDING)
                    .values_list("sending_until", flat=True).first())
        if deadline is not None:  # re-armed by a call that started late: look again then
            send_check(context, pk, n, max((deadline - timezone.now()).total_seconds(), 0.0) + 0.5)


def register() -> None:
    """Serve the alerts queue in this process (idempotent)."""
    handlers.register(get_settings().ALERTS_QUEUE, None, deliver)
