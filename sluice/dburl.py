"""``DATABASE_URL`` → a Django ``DATABASES`` entry.

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
