"""What a server or worker process checks before it starts serving.

A web app or worker running with DEBUG off and a publicly known secret key lets anyone
who has read the source forge session cookies, and with them an operator's right to
retry, edit and delete messages.  So every long-running entry point refuses to start
then — gunicorn (sluice/gunicorn_conf.py), any WSGI server (sluice/wsgi.py), Celery
workers and beat (workers/celery.py), ``sluice worker`` — with one line that says how to
make a key.

The check runs when those start, not when settings are imported: management commands
(migrate, ``sluice queue list``, ``check --deploy``) and the test suite's in-process
client never sign anything a stranger could present, and need no key of their own.
"""
from __future__ import annotations

import gc
import sys

#: The key sluice/settings.py falls back to when DJANGO_SECRET_KEY is unset: published in
#: this repository, so good for DEBUG only.
DEVELOPMENT_SECRET_KEY = "sluice-dev-only-change-me"
#: Keys once published as defaults (an old docker-compose.yml): refused like the development key.
PUBLISHED_SECRET_KEYS = frozenset({DEVELOPMENT_SECRET_KEY, "sluice-compose-dev-only-change-me"})
#: How to make a key, quoted in the refusal.
GENERATE_KEY = "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"


def secret_key_problem(secret_key: str, debug: bool) -> str | None:
    """Why this key must not serve (None: it may).  Any key is fine under DEBUG."""
    if debug or (secret_key and secret_key not in PUBLISHED_SECRET_KEYS):
        return None
    return ("DJANGO_SECRET_KEY is unset or a published development value and DEBUG is off; "
            f"set DJANGO_SECRET_KEY to a long random secret, e.g. the output of: {GENERATE_KEY}")


def refusal(what: str) -> str | None:
    """The one-line refusal for starting ``what`` with the configured settings, or None."""
    from django.conf import settings

    problem = secret_key_problem(settings.SECRET_KEY, settings.DEBUG)
    return f"sluice: refusing to start {what}: {problem}" if problem else None


def refuse_to_start_insecurely(what: str, exit_code: int = 1) -> None:
    """Print the refusal to stderr and exit (no traceback) when ``what`` must not start."""
    message = refusal(what)
    if message:
        # The process's own stderr: Celery beat has already swapped sys.stderr for a proxy
        # that would turn the line into a log record.
        print(message, file=sys.__stderr__ or sys.stderr, flush=True)
        raise SystemExit(exit_code)


def settle_heap() -> None:
    """Once a server process has loaded what it serves with, take those objects (modules,
    models, URL patterns, templates: alive as long as the process) out of the cyclic
    garbage collector's sight.  Otherwise every full collection walks them all again: in a
    dashboard process that was a 150 ms pause every ten or so requests of the monitoring
    tab, its p95.  Garbage from start-up is collected first; what requests allocate later
    is collected as before."""
    gc.collect()
    gc.freeze()
