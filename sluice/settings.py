"""Django settings for Sluice.  The environment is read here and nowhere else.

- ``DATABASE_URL``: ``sqlite:///var/sluice.sqlite3`` (default), ``postgresql://…``, ``mssql://…``
- ``SLUICE_OTHER_DATABASE_URL``: when set, a second database alias ``other`` (an outbox
  destination ``queue@other``; the tests use it for cross-database delivery)
- ``REDIS_URL``: ``redis://127.0.0.1:6379/0`` (default)
- ``SLUICE_*``: see core/conf.py for every option, its type and default.
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS``.
"""
import os
from pathlib import Path

from core.conf import from_environ
from sluice.dburl import parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "sluice-dev-only-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "0").lower() in ("1", "true", "yes")
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "rest_framework",
    "rest_framework.authtoken",
    "core",
    "core.demo",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "sluice.urls"
WSGI_APPLICATION = "sluice.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", "sqlite:///var/sluice.sqlite3")
DATABASES = {"default": parse_database_url(DATABASE_URL, BASE_DIR)}
if os.environ.get("SLUICE_OTHER_DATABASE_URL"):
    DATABASES["other"] = parse_database_url(os.environ["SLUICE_OTHER_DATABASE_URL"], BASE_DIR)
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "sluice": {"handlers": ["console"], "level": os.environ.get("SLUICE_LOG_LEVEL", "INFO"), "propagate": False},
        "django": {"handlers": ["console"], "level": "WARNING"},
    },
}

globals().update(from_environ())
