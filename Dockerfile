# Sluice application image (web, worker, beat). Used by docker-compose.yml.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# libodbc2 + unixodbc: libodbc.so.2 for pyodbc, which mssql-django imports at import time.
# libltdl7 + libkrb5-3 + libgssapi-krb5-2: needed by the ODBC driver that mssql-python
# bundles (the driver selected with ?python_driver=mssql_python in DATABASE_URL).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        libodbc2 unixodbc libltdl7 libkrb5-3 libgssapi-krb5-2 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . .
RUN pip install . \
 && rm -rf build ./*.egg-info \
 && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin sluice \
 && mkdir -p /app/var \
 && chown sluice:sluice /app/var

USER sluice
EXPOSE 8000
# docker-compose.yml overrides this per service (web / worker / beat).
CMD ["python", "manage.py", "runserver", "0.0.0.0:8000", "--noreload", "--insecure"]
