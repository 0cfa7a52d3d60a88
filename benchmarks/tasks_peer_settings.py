"""The tasks benchmark's django-tasks-db project: Django, the framework and django-tasks-db
only, on the benchmark's database (DATABASE_URL), with persistent connections as a deployed
``db_worker`` has (Django's default, a new connection per task, would measure connecting)."""
import os
from pathlib import Path

from sluice.dburl import parse_database_url

SECRET_KEY = "tasks-benchmark-peer-not-secret"
DEBUG = False
USE_TZ = True
try:
    import django.tasks  # noqa: F401  (Django 6: the framework is built in)
    INSTALLED_APPS = ["django_tasks_db"]
except ImportError:
    INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
DATABASES = {"default": {**parse_database_url(os.environ["DATABASE_URL"], Path.cwd()), "CONN_MAX_AGE": 600}}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
