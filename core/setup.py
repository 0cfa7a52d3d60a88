"""`sluice setup`: everything a fresh database needs, idempotently."""
from __future__ import annotations

import logging

from django.core.management import call_command

from core.conf import get_settings
from core.handlers import handlers, load_handler_modules
from core.models import QueueKind
from core.outbox import OutboxStore, create_outbox_table
from core.queues import apply_table_upkeep, create_queue, missing_indexes
from core.scheduling import delayed_store

log = logging.getLogger("sluice.setup")


def setup_infrastructure(using: str | None = None) -> list[tuple[str, bool]]:
    """Migrate Sluice's own tables, create the delayed-message store, then the error queue,
    every queue that has a handler and every queue in SLUICE_QUEUES, and the outbox table.
    Returns [(queue or table, created)]."""
    settings = get_settings()
    alias = using or settings.DATABASE
    call_command("migrate", interactive=False, verbosity=0, database=alias)
    load_handler_modules()
    wanted: list[tuple[str, str]] = [(settings.ERROR_QUEUE, QueueKind.ERROR)]
    wanted += [(name, QueueKind.NORMAL) for name in [*handlers.queues(), *settings.QUEUES]]
    delayed_store(alias).setup_infrastructure()
    done: list[tuple[str, bool]] = []
    seen: set[str] = set()
    for name, kind in wanted:
        if name in seen:
            continue
        seen.add(name)
        _, created = create_queue(name, kind=kind, using=alias)
        missing_indexes(name, alias)
        done.append((name, created))
    apply_table_upkeep(alias)  # queues made by `sluice queue create` or an older Sluice too
    table, created = create_outbox_table(alias)
    OutboxStore(alias, table).missing_indexes()
    done.append((table, created))
    return done
