"""gunicorn's configuration for the Sluice web app, one file for every way it is served:
`make run` (scripts/run.sh), docker-compose.yml and the production command in the README:

    gunicorn -c python:sluice.gunicorn_conf --bind 0.0.0.0:8000 sluice.wsgi

Flags on the command line, or in ``GUNICORN_CMD_ARGS``, override the values below (e.g.
``--workers 4`` on a machine with more cores).  Everything else — database, secret key,
HTTPS, log format — comes from the Django settings, so from sluice/settings.py.
"""
from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sluice.settings")

from gunicorn import glogging  # noqa: E402

from core.conf import get_settings  # noqa: E402
from core.startup import refuse_to_start_insecurely  # noqa: E402
from sluice.logs import JsonFormatter  # noqa: E402

# In the master, before it binds or forks, so the refusal is one line: a worker that
# refused (sluice/wsgi.py) would leave gunicorn logging around it.
refuse_to_start_insecurely("the web server (gunicorn)")

bind = "127.0.0.1:8000"

# Sized for 2 cores: one process per core (the GIL runs one Python thread at a time in a
# process) and 4 threads each, because a dashboard request mostly waits on the database
# or Redis: 8 requests in flight.  Threads also keep idle keep-alive connections and slow
# clients from tying up a whole process, which matters when no buffering proxy sits in
# front (`make run`, the compose file's port).
worker_class = "gthread"
workers = 2
threads = 4
# A worker process that stops answering its master for 30 s (stuck in C code, deadlocked)
# is killed and replaced.  Requests themselves stay short: bulk operations run as Celery
# tasks and the pages poll their progress.
timeout = 30
# On SIGTERM (docker stop, Ctrl-C in `make run`), requests in flight get 20 s to finish.
graceful_timeout = 20
keepalive = 5
# Recycle a worker after about 2,000 requests (jittered so both do not restart at once):
# bounds slow memory growth at the cost of one fork.
max_requests = 2000
max_requests_jitter = 200

# Access log to stdout, errors to stderr; the request time in ms, and the client address
# the proxy saw (X-Forwarded-For) beside the proxy's own.
accesslog = "-"
errorlog = "-"
loglevel = "info"
access_log_format = '%(h)s "%({x-forwarded-for}i)s" %(t)s "%(r)s" %(s)s %(B)s %(M)sms "%(f)s" "%(a)s"'

# gunicorn >= 25 opens a control socket at one fixed path per user by default: two servers
# on one machine (tests, another checkout) would fight over it, and nothing here uses it.
control_socket_disable = True


class JsonLogger(glogging.Logger):
    """gunicorn's own logger, writing JSON lines (SLUICE_LOG_FORMAT=json)."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(JsonFormatter())


if get_settings().LOG_FORMAT == "json":
    logger_class = JsonLogger
