"""The WSGI application (gunicorn: ``sluice.wsgi``; see sluice/gunicorn_conf.py)."""
import os

from django.core.wsgi import get_wsgi_application

from core.startup import refuse_to_start_insecurely

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sluice.settings")
# Any WSGI server (gunicorn without our config, uwsgi, mod_wsgi, runserver with DEBUG off)
# refuses a published secret key here.  Exit code 4 is gunicorn's "App failed to load":
# its master then stops instead of respawning the worker for ever.
refuse_to_start_insecurely("the web app", exit_code=4)
application = get_wsgi_application()
