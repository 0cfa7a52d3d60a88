"""Sluice: SQL-table messaging for Django."""

#: Sluice's version, from its one source (core/__init__.py).
from core import __version__  # noqa: F401
