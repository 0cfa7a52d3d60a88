"""Django settings for Sluice.  The environment is read here and nowhere else.

- ``DATABASE_URL``: ``sqlite:///var/sluice.sqlite3`` (default), ``postgresql://…``, ``mssql://…``
- ``SLUICE_OTHER_DATABASE_URL``: when set, a second database alias ``other`` (an outbox
  destination ``queue@other``; the tests use it for cross-database delivery)
- ``REDIS_URL``: ``redis://127.0.0.1:6379/0`` (default)
- ``SLUICE_*``: see core/conf.py for every option, its type and default.
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS``.
- HTTPS: ``DJANGO_SECURE_PROXY_SSL_HEADER``, ``DJANGO_SECURE_SSL_REDIRECT``,
  ``DJANGO_SECURE_COOKIES``, ``DJANGO_SECURE_HSTS_SECONDS``,
  ``DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS``, ``DJANGO_SECURE_HSTS_PRELOAD``,
  ``DJANGO_CSRF_TRUSTED_ORIGINS``; their defaults follow ``SLUICE_ENV``.
- ``DJANGO_STATIC_ROOT``: where ``collectstatic`` puts static files (``var/static``).
- E-mail (alert notifications): ``EMAIL_URL`` (``smtp://user:pass@host:587?tls=1``,
  ``smtps://…:465``) or ``EMAIL_HOST``, ``EMAIL_PORT``, ``EMAIL_HOST_USER``,
  ``EMAIL_HOST_PASSWORD``, ``EMAIL_USE_TLS`` / ``EMAIL_USE_SSL``, ``EMAIL_TIMEOUT``;
  ``DEFAULT_FROM_EMAIL``.
- ``SLUICE_SESSION_IDLE_MINUTES``: a dashboard session ends after this long without a
  request (60); ``SLUICE_LOGIN_FAILURE_LIMIT`` failed logins per user name and address
  lock that pair out for ``SLUICE_LOGIN_COOLOFF_MINUTES`` (5, 15).
- ``SLUICE_API_TOKEN_DAYS``: how long an API token from ``sluice user token`` lives (90).
- ``SLUICE_API_RATE_ANON``, ``SLUICE_API_RATE_USER``: DRF throttle rates (``30/min``, ``1200/min``).
"""
import datetime as dt
import os
from pathlib import Path

from core.conf import SluiceSettings, from_environ
from core.startup import DEVELOPMENT_SECRET_KEY
from sluice.dburl import parse_database_url, parse_email_url

PACKAGE_DIR = Path(__file__).resolve().parent
# Relative paths (sqlite:///var/sluice.sqlite3, var/static) are relative to the checkout when
# Sluice runs from one (manage.py beside this package), else to the directory it runs in:
# an installed wheel's site-packages is no place for a database.
BASE_DIR = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "manage.py").is_file() else Path.cwd()
sluice_options = from_environ()


def env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    return default if raw == "" else raw in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return default if raw == "" else int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None


# Unset: the development key, which core/startup.py refuses to serve with outside DEBUG.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or DEVELOPMENT_SECRET_KEY
DEBUG = env_flag("DJANGO_DEBUG", False)
# Not "testserver": Django's test set-up adds it for the test client itself.
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]

# --- HTTPS -------------------------------------------------------------------------------
# SLUICE_ENV=production makes the secure choices the defaults; each has its own variable.
# Validated here (SluiceSettings), so SLUICE_ENV=prod is an error, not a silent development.
deployment = SluiceSettings(ENV=sluice_options.get("SLUICE_ENV", SluiceSettings.ENV),
                            LOG_FORMAT=sluice_options.get("SLUICE_LOG_FORMAT", SluiceSettings.LOG_FORMAT))
production = deployment.ENV == "production"
# Behind a TLS-terminating proxy Django sees plain HTTP; the proxy's header says what the
# client used ("X-Forwarded-Proto: https").  The proxy must set it, overwriting what the
# client sent.  Empty: trust no header (gunicorn serving TLS itself, or no TLS at all).
_proxy_header = os.environ.get("DJANGO_SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto: https" if production else "")
if _proxy_header.strip():
    _name, _sep, _value = _proxy_header.partition(":")
    if not _sep or not _name.strip() or not _value.strip():
        raise ValueError(f"DJANGO_SECURE_PROXY_SSL_HEADER wants 'Header-Name: value', not {_proxy_header!r}")
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _name.strip().upper().replace("-", "_"), _value.strip())
SECURE_SSL_REDIRECT = env_flag("DJANGO_SECURE_SSL_REDIRECT", production)
# Health probes and Prometheus come from inside the network over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_flag("DJANGO_SECURE_COOKIES", production)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 365 * 24 * 3600 if production else 0)
# Subdomains of the dashboard's own host only (HSTS scopes to the host that sends it).
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", production)
# Preloading is a commitment for a whole registrable domain, made by its owner, not by one
# tool on one host: off unless asked for, so its deploy-check warning is silenced here.
SECURE_HSTS_PRELOAD = env_flag("DJANGO_SECURE_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "rest_framework",
    "axes",
    "drf_spectacular",
    "core",
    "core.demo",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Every GET's queries are bounded by SLUICE_DASHBOARD_STATEMENT_TIMEOUT (a 503 past it).
    "dashboard.timeouts.StatementTimeoutMiddleware",
    "csp.middleware.CSPMiddleware",
    "dashboard.security.middleware.security_headers",
    "dashboard.security.middleware.api_query_without_nul",
    # Last, as django-axes asks: it turns a locked-out login into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

# --- logins --------------------------------------------------------------------------------
# django-axes counts failed logins (the dashboard's and the admin's: both go through
# authenticate()) per user name *and* address: one address guessing one account is stopped,
# while a stranger cannot lock a real operator out from elsewhere.
# Passwords (refused while SLUICE_LOCAL_LOGIN is off), then single sign-on: OpenID Connect,
# active once SLUICE_OIDC_ISSUER names a provider (dashboard/security/oidc.py).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "dashboard.security.oidc.LocalPasswordBackend",
                           "dashboard.security.oidc.SluiceOIDCBackend"]
AXES_FAILURE_LIMIT = env_int("SLUICE_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = dt.timedelta(minutes=env_int("SLUICE_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_TEMPLATE = "dashboard/locked_out.html"
# Django's validators, for `sluice user add` and the admin's password forms alike.
AUTH_PASSWORD_VALIDATORS = [{"NAME": f"django.contrib.auth.password_validation.{name}"} for name in (
    "UserAttributeSimilarityValidator", "MinimumLengthValidator", "CommonPasswordValidator",
    "NumericPasswordValidator")]
# An idle timeout: every request renews the cookie, so only a session left alone expires.
SESSION_COOKIE_AGE = env_int("SLUICE_SESSION_IDLE_MINUTES", 60) * 60
SESSION_SAVE_EVERY_REQUEST = True

# --- Content-Security-Policy (django-csp) --------------------------------------------------
# Scripts only from our own static files: no inline script, no eval (htmx's trigger filters
# and hx-on need eval; base.html turns it off).  Style *attributes* stay allowed: progress
# bars set their width in one, and an attribute cannot run script.
CONTENT_SECURITY_POLICY = {"DIRECTIVES": {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "style-src-attr": ["'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
}}
#: The browser features no page uses (dashboard/security/middleware.py sends the header).
PERMISSIONS_POLICY = ("accelerometer=(), camera=(), geolocation=(), gyroscope=(), magnetometer=(), "
                      "microphone=(), payment=(), usb=(), interest-cohort=()")

ROOT_URLCONF = "sluice.urls"
WSGI_APPLICATION = "sluice.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [PACKAGE_DIR / "templates"],
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

# The JSON API (dashboard/api) names its own authentication, permissions, throttles, parsers
# and renderers (dashboard/api/base.py): no REST_FRAMEWORK block is needed here or in a host.

# "sluice": the dashboard's statistics snapshot, shared by every process (Redis); the
# dashboard falls back to a per-process cache while Redis is down.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "sluice": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "sluice",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    },
}

# --- e-mail (alert notifications of format "email") ------------------------------------------
# EMAIL_URL (smtp://user:password@host:port, smtps:// for TLS on connect, ?tls=1 for STARTTLS),
# or the single variables; the password is read here and never logged.
EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS, EMAIL_USE_SSL = parse_email_url(
    os.environ.get("EMAIL_URL", ""))
EMAIL_HOST = os.environ.get("EMAIL_HOST", EMAIL_HOST)
EMAIL_PORT = env_int("EMAIL_PORT", EMAIL_PORT)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", EMAIL_HOST_USER)
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", EMAIL_HOST_PASSWORD)
EMAIL_USE_TLS = env_flag("EMAIL_USE_TLS", EMAIL_USE_TLS)
EMAIL_USE_SSL = env_flag("EMAIL_USE_SSL", EMAIL_USE_SSL)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ValueError("EMAIL_USE_TLS and EMAIL_USE_SSL are exclusive: STARTTLS on a plain port, or TLS on connect")
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "sluice@localhost")
SERVER_EMAIL = os.environ.get("SERVER_EMAIL", DEFAULT_FROM_EMAIL)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT") or BASE_DIR / "var" / "static")
# WhiteNoise serves what `collectstatic` gathered into STATIC_ROOT, with DEBUG off too:
# gzip copies and content-hashed names (the manifest), so browsers cache them for good.
# Without a collectstatic run the manifest is missing and {% static %} raises; the test
# suite therefore switches to plain names (tests/conftest.py).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
                   "json": {"()": "sluice.logs.JsonFormatter"}},
    # SLUICE_LOG_FORMAT=json: one JSON object per line (gunicorn and Celery use it too).
    # stderr (StreamHandler's default), not stdout: the CLI's --json output owns stdout.
    "handlers": {"console": {"class": "logging.StreamHandler",
                             "formatter": "json" if deployment.LOG_FORMAT == "json" else "plain"}},
    "loggers": {
        "sluice": {"handlers": ["console"], "level": os.environ.get("SLUICE_LOG_LEVEL", "INFO"), "propagate": False},
        "django": {"handlers": ["console"], "level": "WARNING"},
        # Python warnings (Django routes them to logging), e.g. WhiteNoise's "No directory at".
        "py.warnings": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}

globals().update(sluice_options)
