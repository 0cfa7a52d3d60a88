"""The bundled settings with a URLconf whose 404 view cannot be imported (urls.E008): for
tests/test_worker_footprint.py, which checks the URL checks still run where they should."""
from sluice.settings import *  # noqa: F401,F403

ROOT_URLCONF = "tests.broken_urls"
