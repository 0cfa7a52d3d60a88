"""Leases: one process at a time does a job (the delayed mover), others stand by.

A lease row names its holder and when it lapses, in the database's clock.  The holder
renews it well before then; when a holder dies, the lease lapses and a stand-by takes
it over.  A graceful stop releases it at once.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Now

from core.models import Lease as LeaseRecord


class Lease:
    def __init__(self, name: str, seconds: float, using: str) -> None:
        self.name = name
        self.seconds = seconds
        self.using = using
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._held_until = 0.0  # monotonic: when our own renewal is due at the latest

    @property
    def renew_every(self) -> float:
        """The holder renews at least this often (a third of the lease)."""
        return self.seconds / 3

    def follower_wait(self) -> float:
        return min(self.seconds / 2, 5.0)

    def acquire(self) -> bool:
        """Take or renew the lease; True while this process holds it."""
        now = time.monotonic()
        if now < self._held_until - self.seconds * 2 / 3:
            return True  # renewed recently: no round trip
        rows = LeaseRecord.objects.using(self.using).filter(name=self.name).filter(
            Q(holder=self.holder) | Q(expires_at__isnull=True) | Q(expires_at__lt=Now())
        ).update(holder=self.holder, expires_at=Now() + timedelta(seconds=self.seconds))
        if rows == 0 and not LeaseRecord.objects.using(self.using).filter(name=self.name).exists():
            try:
                with transaction.atomic(using=self.using):
                    LeaseRecord.objects.using(self.using).create(name=self.name, holder="", expires_at=None)
            except IntegrityError:
                pass  # someone else created it first
            return self.acquire()
        self._held_until = now + self.seconds if rows else 0.0
        return bool(rows)

    @property
    def held(self) -> bool:
        return bool(self._held_until)

    def release(self) -> None:
        if self._held_until:
            LeaseRecord.objects.using(self.using).filter(name=self.name, holder=self.holder).update(
                expires_at=None, holder="")
            self._held_until = 0.0
