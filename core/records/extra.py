"""The ``pipeline`` extra: pyspark, pyarrow and pandas are optional (most users of the
queue never run the analytics pipeline).  Whatever needs them asks :func:`require` first,
so a missing package is one clear sentence, not an ImportError deep in a traceback."""
from __future__ import annotations

import importlib.util

INSTALL = 'pip install "django-sluice[pipeline]"'


class PipelineExtraMissing(RuntimeError):
    """A package of the ``pipeline`` extra is not installed."""


def missing(*modules: str) -> list[str]:
    """Which of ``modules`` cannot be imported here."""
    absent = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            absent.append(name)
    return absent


def require(*modules: str) -> None:
    """Raise :class:`PipelineExtraMissing` naming what to install when any of ``modules`` is absent."""
    absent = missing(*modules)
    if absent:
        raise PipelineExtraMissing(f"the analytics pipeline needs {' and '.join(absent)}, which is not "
                                   f"installed: {INSTALL}")
