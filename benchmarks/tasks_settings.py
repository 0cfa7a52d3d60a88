"""The tasks benchmark's Sluice project: the bundled settings with Sluice's task backend."""
from sluice.settings import *  # noqa: F401,F403

TASKS = {"default": {"BACKEND": "core.tasks.backend.SluiceTaskBackend", "QUEUES": ["default"],
                     "OPTIONS": {"QUEUE_PREFIX": "bench_tasks_"}}}
