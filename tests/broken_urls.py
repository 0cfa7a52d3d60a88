"""The bundled URLs with a 404 handler that does not exist (tests/broken_urls_settings.py)."""
from sluice.urls import urlpatterns  # noqa: F401

handler404 = "tests.no_such_module.page_not_found"
