"""Sluice: SQL-table messaging for Django."""

#: The one source of Sluice's version: pyproject.toml reads it (``dynamic = ["version"]``),
#: ``python -m sluice --version`` and ``manage.py sluice --version`` print it.
__version__ = "0.1.0"
