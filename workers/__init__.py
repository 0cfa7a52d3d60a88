"""Celery hosting for Sluice's loops (`celery -A workers worker|beat`)."""
from workers.celery import app

__all__ = ["app"]
