"""The WSGI application (gunicorn: ``sluice.wsgi``; see sluice/gunicorn_conf.py)."""
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from core.startup import refuse_to_start_insecurely, settle_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sluice.settings")
# Any WSGI server (gunicorn without our config, uwsgi, mod_wsgi, runserver with DEBUG off)
# refuses a published secret key here.  Exit code 4 is gunicorn's "App failed to load":
# its master then stops instead of respawning the worker for ever.
refuse_to_start_insecurely("the web app", exit_code=4)
application = get_wsgi_application()
# The URL patterns (and the views they import) load lazily, at the first request: load
# them now, so that what lives as long as the process is settled before it serves.
get_resolver().url_patterns  # noqa: B018 — loaded for its side effect
settle_heap()
