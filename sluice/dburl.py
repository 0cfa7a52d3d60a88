"""``DATABASE_URL`` → a Django ``DATABASES`` entry, and ``EMAIL_URL`` → Django's e-mail settings.

Supported: ``sqlite:///relative/path``, ``sqlite:////absolute/path``,
``postgresql://user:pass@host:port/name`` (also ``postgres://``) and
``mssql://user:pass@host:port/name?driver=...`` (mssql-django).
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit


class DatabaseUrlError(ValueError):
    pass


def parse_database_url(url: str, base_dir: Path) -> dict:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    options = dict(parse_qsl(parts.query))
    if scheme == "sqlite":
        raw = url[len("sqlite://"):].split("?", 1)[0]
        if not raw.startswith("/") or raw == "/":
            raise DatabaseUrlError(f"sqlite URL needs a path: sqlite:///file.sqlite3, not {url!r}")
        path = raw[1:]
        name = Path(path) if path.startswith("/") else base_dir / path
        # The default (sqlite:///var/sluice.sqlite3) names a folder a fresh directory lacks:
        # made here, so the first command does not fail with "unable to open database file".
        try:
            name.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # read-only or not ours: SQLite's own error then says which file
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(name),
            # Sluice receives with BEGIN IMMEDIATE + DELETE ... RETURNING: taking the
            # write lock up front avoids the deferred-upgrade "database is locked" trap.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": str(name.with_name("test_" + name.name))},
        }
    common = {
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }
    if scheme in ("postgresql", "postgres", "pgsql"):
        if not common["NAME"]:
            raise DatabaseUrlError(f"postgresql URL needs a database name: {url!r}")
        return {"ENGINE": "django.db.backends.postgresql", **common, "OPTIONS": options, "CONN_HEALTH_CHECKS": True}
    if scheme == "mssql":
        if not common["NAME"]:
            raise DatabaseUrlError(f"mssql URL needs a database name: {url!r}")
        opts = {"driver": options.pop("driver", "ODBC Driver 18 for SQL Server")}
        if "python_driver" in options:
            opts["python_driver"] = options.pop("python_driver")
        extra = ";".join(f"{k}={v}" for k, v in options.items())
        if extra:
            opts["extra_params"] = extra
        return {"ENGINE": "mssql", **common, "OPTIONS": opts, "CONN_HEALTH_CHECKS": True}
    raise DatabaseUrlError(
        f"unsupported DATABASE_URL scheme {scheme!r}: use sqlite:///, postgresql:// or mssql://"
    )


def parse_email_url(url: str) -> tuple[str, int, str, str, bool, bool]:
    """``EMAIL_URL`` → (host, port, user, password, use_tls, use_ssl); empty: Django's defaults
    (localhost:25, no login).  ``smtp://`` (``?tls=1``: STARTTLS) or ``smtps://`` (TLS on
    connect); user and password percent-encoded."""
    if not url.strip():
        return "localhost", 25, "", "", False, False
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("smtp", "smtps") or not parts.hostname:
        raise DatabaseUrlError("EMAIL_URL wants smtp://user:password@host:port or smtps://host:port (the value is not shown: it may hold a password)")
    options = dict(parse_qsl(parts.query))
    ssl = scheme == "smtps"
    tls = options.get("tls", "").lower() in ("1", "true", "yes", "on")
    return (parts.hostname, parts.port or (465 if ssl else 25), unquote(parts.username or ""),
            unquote(parts.password or ""), tls, ssl)
