# Sluice application image (web, worker, beat). Used by docker-compose.yml.
# It installs Sluice the way users do: the built wheel, with the extras the deployment
# needs (SQL Server for the compose file) and no test extras, so it runs the same code path
# as tests/test_clean_install.py (a plain install, run from a directory without the source).

# -- build: the wheel, from the source tree ------------------------------------------------
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /dist .

# -- the image: the installed wheel and nothing else of the source --------------------------
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=sluice.settings

# libodbc2 + unixodbc: libodbc.so.2 for pyodbc, which mssql-django imports at import time.
# libltdl7 + libkrb5-3 + libgssapi-krb5-2: needed by the ODBC driver that mssql-python
# bundles (the driver selected with ?python_driver=mssql_python in DATABASE_URL).
# openjdk-17-jre-headless: the analytics pipeline's embedded Spark driver (docs/pipeline.md);
# slim images lack the man directory its package scripts write to.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
        libodbc2 unixodbc libltdl7 libkrb5-3 libgssapi-krb5-2 openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*

# EXTRAS: which of django-sluice's extras the image carries (default: mssql for
# docker-compose.yml's SQL Server and pipeline for the Spark job; add otel for OpenTelemetry).
ARG EXTRAS=mssql,pipeline
COPY --from=build /dist/ /dist/
RUN pip install "$(ls /dist/django_sluice-*.whl)[${EXTRAS}]" && rm -rf /dist

WORKDIR /app
# manage.py only: docker-compose.yml runs `python manage.py ...` (the `sluice` command,
# `sluice manage ...`, is the same).  Relative paths (var/static) are relative to /app.
COPY manage.py ./
# collectstatic at build time: WhiteNoise serves /app/var/static (compressed copies,
# content-hashed names) from every container of this image, with nothing to do at start.
RUN sluice manage collectstatic --noinput -v0 \
 && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin sluice \
 && mkdir -p /app/var/pipeline \
 && chown -R sluice:sluice /app/var

USER sluice
EXPOSE 8000
# The web app (sluice/gunicorn_conf.py: 2 workers x 4 threads, 30 s timeout, access log on
# stdout). docker-compose.yml overrides the command per service (web / worker / beat).
CMD ["gunicorn", "-c", "python:sluice.gunicorn_conf", "--bind", "0.0.0.0:8000", "sluice.wsgi"]
