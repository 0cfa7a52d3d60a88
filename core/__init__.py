"""Sluice's messaging engine: queue tables, dialects, pump, expiry, recoverability.

Nothing in here imports the dashboard or the workers (see the import-linter
contract in pyproject.toml).
"""
