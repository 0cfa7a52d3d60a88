#!/usr/bin/env bash
# Local demo: start Redis, migrate, create the queues, collect static files, create the
# dashboard login, then run the web dashboard (gunicorn) and one Celery worker (hosting
# Sluice's pumps and delayed mover, with Celery beat, a process of its own, for the periodic tasks) side by
# side until Ctrl-C. Used by `make run` (after scripts/bootstrap.sh).
#
# The web app runs as in production — gunicorn with sluice/gunicorn_conf.py, DEBUG off,
# WhiteNoise serving the collected static files — so what the demo shows is what a
# deployment serves (no development server, no --insecure static serving), only without
# HTTPS on loopback.
#
# Environment:
#   DATABASE_URL    default sqlite:///var/sluice.sqlite3 (see sluice/settings.py)
#   DEMO=0          run the worker without demo traffic (SLUICE_DEMO_TRAFFIC=0)
#   RUN_ADDR        address gunicorn binds, default 127.0.0.1:8000
#   STOP_TIMEOUT    seconds to wait for the children after INT/TERM before SIGKILL (default 20)
#   SLUICE_RUN_DIR  local state (default var): secret_key and admin_password (generated
#                   once, kept), static/ (collectstatic), access.log, the beat schedule
#   DJANGO_SECRET_KEY  used when set, instead of $SLUICE_RUN_DIR/secret_key
#
# Ctrl-C / SIGTERM: both children get the same signal, are waited for, exit 0.
# If one child dies on its own, the other is stopped and the script exits non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${SLUICE_PY:-.venv/bin/python}
RUN_ADDR=${RUN_ADDR:-127.0.0.1:8000}
STOP_TIMEOUT=${STOP_TIMEOUT:-20}
[ -x "$PY" ] || { echo "[run] $PY not found: run 'make venv' (scripts/bootstrap.sh) first" >&2; exit 1; }

say() { printf '[run] %s\n' "$*" >&2 || true; }  # never fatal (set -e): stderr may be a closed pipe

RUN_DIR=${SLUICE_RUN_DIR:-var}
mkdir -p "$RUN_DIR"
RUN_DIR=$(cd "$RUN_DIR" && pwd)
ADMIN_USER=admin

# new_secret FILE: a random token written once (mode 600) and kept: sessions and the
# login survive restarts. var/ is in .gitignore.
new_secret() {
    [ -s "$1" ] || (umask 077 && "$PY" -c 'import secrets, sys; print(secrets.token_urlsafe(int(sys.argv[1])))' "$2" > "$1")
}
# Outside DEBUG the servers refuse the published development key (core/startup.py).
if [ -z "${DJANGO_SECRET_KEY:-}" ]; then
    new_secret "$RUN_DIR/secret_key" 50
    DJANGO_SECRET_KEY=$(cat "$RUN_DIR/secret_key")
    export DJANGO_SECRET_KEY
fi
export DJANGO_STATIC_ROOT=${DJANGO_STATIC_ROOT:-$RUN_DIR/static}

bash scripts/services.sh redis
"$PY" manage.py migrate --noinput
"$PY" manage.py sluice setup
"$PY" manage.py collectstatic --noinput -v0
# A login for the dashboard: operator role (may act), password generated once.
new_secret "$RUN_DIR/admin_password" 12
# On stdin, not the command line (where other users of the machine could read it).
"$PY" manage.py sluice user add "$ADMIN_USER" --role operator --password-stdin --update < "$RUN_DIR/admin_password"

# One Celery worker: the bootstep runs the pumps, the mover and the health heartbeat.
# Beat (purge, idle queues, error ingestion) runs as a process of its own, as in the
# compose file: an embedded beat (-B) is forked after the worker's loop threads hold
# SQLite connections, and now and then hung at exit on a lock held across the fork.
# Demo traffic unless DEMO=0.
export SLUICE_DEMO_TRAFFIC=1
[ "${DEMO:-1}" = 0 ] && export SLUICE_DEMO_TRAFFIC=0
worker_cmd=("$PY" -m celery -A workers worker --pool=threads --concurrency=2 --loglevel=info
            --hostname="sluice@%h")
beat_cmd=("$PY" -m celery -A workers beat --loglevel=info --schedule="$RUN_DIR/celerybeat-schedule")
# gunicorn as in production (sluice/gunicorn_conf.py); the access log goes to a file here
# because the dashboard's polling would bury the worker's log in this terminal.
web_cmd=("$PY" -m gunicorn -c python:sluice.gunicorn_conf --bind "$RUN_ADDR"
         --access-logfile "$RUN_DIR/access.log" sluice.wsgi)

# Job control puts each child in its own process group: a terminal Ctrl-C reaches
# only this script, which forwards exactly one signal to each child. (Without it,
# bash starts background children with SIGINT ignored, and Python would never see it.)
set -m

web_pid=
worker_pid=
beat_pid=

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
# group_alive PID: a process is left in the child's process group (each child leads its
# own, see set -m): gunicorn's workers, a worker's pool.
group_alive() { [ -n "$1" ] && kill -0 -- "-$1" 2>/dev/null; }

# stop_children SIGNAL: signal both process groups (as a terminal's Ctrl-C signals its
# foreground group), wait up to STOP_TIMEOUT s, then SIGKILL what is left: a stuck
# process must not outlive `make run`.
stop_children() {
    local sig=$1 pid i
    for pid in $web_pid $worker_pid $beat_pid; do
        if group_alive "$pid"; then kill -s "$sig" -- "-$pid" 2>/dev/null || true; fi
    done
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        group_alive "$web_pid" || group_alive "$worker_pid" || group_alive "$beat_pid" || break
        sleep 0.1
    done
    for pid in $web_pid $worker_pid $beat_pid; do
        if group_alive "$pid"; then
            say "process group $pid did not stop within ${STOP_TIMEOUT}s; killing it"
            kill -s KILL -- "-$pid" 2>/dev/null || true
        fi
    done
    wait 2>/dev/null || true
}

# shellcheck disable=SC2317  # invoked from the traps below
on_signal() {
    trap '' INT TERM HUP
    say "received SIG$1: stopping web server, worker and beat"
    local fwd=$1
    [ "$fwd" = HUP ] && fwd=TERM
    stop_children "$fwd"
    say "stopped"
    exit 0
}
trap 'on_signal INT' INT
# `make run | tee log`: a Ctrl-C also ends tee; writing to its pipe must not kill this
# script before it has stopped the children.
trap '' PIPE
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

"${web_cmd[@]}" &
web_pid=$!
"${worker_cmd[@]}" &
worker_pid=$!
"${beat_cmd[@]}" &
beat_pid=$!

# serving URL: true once the web app answers (any HTTP status: /healthz says 503 while
# the database is down, but the server is up).
serving() {
    "$PY" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=10)
except urllib.error.HTTPError:
    pass
PYEOF
}

# worker_up: the worker's loops started (its heartbeat is in Redis; core/runtime/health.py names
# it <host>:<pid>); by then its start-up banner is printed and cannot bury the login.
worker_up() {
    [ -n "$(redis-cli -u "${REDIS_URL:-redis://127.0.0.1:6379/0}" --scan \
            --pattern "sluice:worker:$(hostname):$worker_pid" 2>/dev/null)" ]
}

url="http://$RUN_ADDR/"
web_up=0
for ((i = 0; i < 900; i++)); do
    alive "$web_pid" && alive "$worker_pid" || break
    if [ "$web_up" = 0 ] && serving "${url}healthz"; then web_up=1; fi
    [ "$web_up" = 1 ] && worker_up && break
    sleep 0.1
done

say "worker: celery worker (pid $worker_pid) + beat (pid $beat_pid); their logs are this terminal; demo traffic: $SLUICE_DEMO_TRAFFIC"
say "web: gunicorn (pid $web_pid; access log $RUN_DIR/access.log)"
say "status: .venv/bin/python manage.py sluice status"
say "database: ${DATABASE_URL:-sqlite:///var/sluice.sqlite3}"
if alive "$web_pid"; then
    say "=================================================================="
    say "  Sluice dashboard: $url"
    say "  log in as:        $ADMIN_USER"
    say "  password:         $(cat "$RUN_DIR/admin_password")"
    say "  (role operator; the password is kept in $RUN_DIR/admin_password)"
    say "=================================================================="
fi
say "press Ctrl-C to stop both"

# Wait for the first child to exit. A trapped signal interrupts `wait` and runs on_signal.
status=0
exited=
wait -n -p exited "$web_pid" "$worker_pid" || status=$?
if [ "$exited" = "$web_pid" ]; then name="web server"; else name="worker"; fi
say "$name (pid $exited) exited with status $status; stopping the other process"
trap '' INT TERM HUP
stop_children TERM
[ "$status" -ne 0 ] || status=1
exit "$status"
