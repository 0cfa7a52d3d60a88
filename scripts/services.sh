#!/usr/bin/env bash
# Make the local services the tests need available: install when missing, start
# when stopped, wait until they answer. Idempotent; fast when all is up.
#
#   bash scripts/services.sh postgres|redis|chromium [...]
#
# postgres: local cluster on 127.0.0.1:5432 with role/database sluice (password sluice,
#           CREATEDB for pytest-django's test database):
#           postgresql://sluice:sluice@127.0.0.1:5432/sluice
# redis:    127.0.0.1:6379, no persistence
# chromium: /usr/bin/chromium for Playwright (executable_path); no `playwright install`
set -euo pipefail
SLUICE_LOG_TAG=services
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PG_HOST=127.0.0.1
PG_PORT=5432
PG_ROLE=sluice
PG_PASSWORD=sluice
PG_DB=sluice
REDIS_HOST=127.0.0.1
REDIS_PORT=6379
REDIS_DIR=${SLUICE_REDIS_DIR:-/tmp/sluice-redis}

# wait_for SECONDS CMD...: poll CMD every 0.5 s until it succeeds; fail after SECONDS.
wait_for() {
    local secs=$1 i
    shift
    for ((i = 0; i < secs * 2; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

# --- PostgreSQL --------------------------------------------------------------------
pg_version() {
    # Newest configured cluster version, else newest installed server version.
    local v
    # shellcheck disable=SC2012  # version directory names are plain numbers
    v="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)"
    # shellcheck disable=SC2012
    [ -n "$v" ] || v="$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -1)"
    echo "$v"
}

pg_superuser_psql() {
    # As the postgres OS user over the local socket (peer auth on a stock install).
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- psql -X -v ON_ERROR_STOP=1 -q -d postgres "$@"
    else
        sudo -u postgres psql -X -v ON_ERROR_STOP=1 -q -d postgres "$@"
    fi
}

svc_postgres() {
    if ! command -v pg_lsclusters >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
        apt_install postgresql
    fi
    local ver
    ver="$(pg_version)"
    [ -n "$ver" ] || die "PostgreSQL is installed but no server version found under /usr/lib/postgresql"
    if [ ! -d "/etc/postgresql/$ver/main" ]; then
        log "creating PostgreSQL cluster $ver/main"
        as_root pg_createcluster "$ver" main
    fi
    if ! as_root pg_ctlcluster "$ver" main status >/dev/null 2>&1; then
        log "starting PostgreSQL cluster $ver/main"
        as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start
    fi
    wait_for 60 pg_isready -q -h "$PG_HOST" -p "$PG_PORT" \
        || die "PostgreSQL is not accepting connections on $PG_HOST:$PG_PORT (see /var/log/postgresql/postgresql-$ver-main.log)"

    pg_superuser_psql <<SQL
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
        CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
    ELSE
        ALTER ROLE $PG_ROLE WITH LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
    END IF;
END
\$\$;
SQL
    # The costs benchmark (--records) takes a checkpoint before each variant: PostgreSQL 15's
    # pg_checkpoint role allows it without a superuser.  Older servers have no such role.
    pg_superuser_psql -q -c "GRANT pg_checkpoint TO $PG_ROLE" >/dev/null 2>&1 || true
    if [ "$(pg_superuser_psql -tA -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]; then
        log "creating database $PG_DB owned by $PG_ROLE"
        pg_superuser_psql -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE"
    fi

    local url="postgresql://$PG_ROLE:$PG_PASSWORD@$PG_HOST:$PG_PORT/$PG_DB"
    PGCONNECT_TIMEOUT=5 psql -X -q -tA "$url" -c 'select 1' >/dev/null \
        || die "cannot connect to $url"
    log "postgres ready: $url"
}

# --- Redis -------------------------------------------------------------------------
redis_ping() { [ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }

svc_redis() {
    if ! command -v redis-server >/dev/null 2>&1; then
        apt_install redis-server
    fi
    command -v redis-cli >/dev/null 2>&1 || apt_install redis-tools
    if ! redis_ping; then
        log "starting redis-server on $REDIS_HOST:$REDIS_PORT"
        mkdir -p "$REDIS_DIR"
        redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
            --save "" --appendonly no --dir "$REDIS_DIR" --logfile "$REDIS_DIR/redis.log" \
            --pidfile "$REDIS_DIR/redis.pid"
        wait_for 30 redis_ping \
            || die "Redis does not answer PING on $REDIS_HOST:$REDIS_PORT (see $REDIS_DIR/redis.log)"
    fi
    log "redis ready: redis://$REDIS_HOST:$REDIS_PORT/0"
}

# --- Chromium ----------------------------------------------------------------------
svc_chromium() {
    if [ ! -x /usr/bin/chromium ]; then
        apt_install chromium
    fi
    [ -x /usr/bin/chromium ] || die "/usr/bin/chromium missing after installing the chromium package"
    log "chromium ready: /usr/bin/chromium"
}

[ "$#" -gt 0 ] || die "usage: $0 postgres|redis|chromium [...]"
for svc in "$@"; do
    case "$svc" in
        postgres|postgresql) svc_postgres ;;
        redis) svc_redis ;;
        chromium) svc_chromium ;;
        *) die "unknown service '$svc' (expected postgres, redis or chromium)" ;;
    esac
done
