"""Sluice's messaging engine: queue tables, dialects, pump, expiry, recoverability.

Nothing in here imports the dashboard, the workers or the bundled project (see the
import-linter contracts in pyproject.toml).
"""

#: The one source of Sluice's version: pyproject.toml reads it (``dynamic = ["version"]``),
#: ``python -m sluice --version`` and ``manage.py sluice --version`` print it, and the
#: tracer and meter carry it.  Here, in the engine every other package imports, so none
#: of them needs the bundled project (``sluice``) for it.
__version__ = "0.2.0"
