"""`manage.py sluice …` run inside the test process: the same command class, parser and
error handling as the real entry point, without a new Python process per call (several
seconds each on a slow machine).

:func:`sluice_here` runs the command the way ``manage.py`` does once Django is set up
(``BaseCommand.run_from_argv``: argparse errors, ``CommandError`` → ``CommandError: …`` on
stderr and a non-zero exit, system checks, connections closed afterwards) and returns a
:class:`subprocess.CompletedProcess` like :func:`tests.conftest.manage`: ``returncode``,
``stdout`` and ``stderr`` as bytes.  Like a child process it starts with an empty queue
registry cache, reads ``--body-file -`` from ``input``, and its ``sluice``/``django`` log
records and any uncaught exception's traceback land in its stderr.

What it cannot do: environment variables read at start-up (``SLUICE_*`` settings), signals,
or a worker's process life — tests of those keep using the real process (``manage``)."""
from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
import traceback
from unittest import mock

from django.core.management import load_command_class

from core.queues import registry

#: The loggers sluice/settings.py sends to the console (stderr) in a real process.
CONSOLE_LOGGERS = ("sluice", "django", "py.warnings")


def sluice_here(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    """``manage.py sluice ARGS`` in this process; the result as :func:`tests.conftest.manage` gives it."""
    out, err = io.StringIO(), io.StringIO()
    console = logging.StreamHandler(err)
    console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    stdin = io.TextIOWrapper(io.BytesIO(input or b""), encoding="utf-8")
    registry.forget()  # a new process starts with nothing cached
    code = 0
    with contextlib.ExitStack() as stack:
        for name in CONSOLE_LOGGERS:
            logger = logging.getLogger(name)
            logger.addHandler(console)
            stack.callback(logger.removeHandler, console)
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(mock.patch.object(sys, "stdin", stdin))
        try:
            # Created inside the redirections: BaseCommand binds sys.stdout/stderr when built.
            load_command_class("core", "sluice").run_from_argv(["manage.py", "sluice", *args])
        except SystemExit as exc:  # what the interpreter makes of it
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                err.write(f"{exc.code}\n")
                code = 1
        except Exception:  # noqa: BLE001 — a real process prints the traceback and exits 1
            traceback.print_exc(file=err)
            code = 1
    registry.forget()
    return subprocess.CompletedProcess(["manage.py", "sluice", *args], code, out.getvalue().encode(),
                                       err.getvalue().encode())
