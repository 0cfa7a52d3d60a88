"""Counting and caching: bounded statistics, failed-message counts, the shared cache, search."""
