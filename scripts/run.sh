#!/usr/bin/env bash
# Local demo: start Redis, migrate, create the queues, then run the web dashboard and one
# Celery worker (hosting Sluice's pumps and delayed mover, with beat embedded for the
# periodic tasks) side by side until Ctrl-C. Used by `make run` (after scripts/bootstrap.sh).
#
# Environment:
#   DATABASE_URL    default sqlite:///var/sluice.sqlite3 (see sluice/settings.py)
#   DEMO=0          run the worker without demo traffic (SLUICE_DEMO_TRAFFIC=0)
#   RUN_ADDR        runserver address, default 127.0.0.1:8000
#   STOP_TIMEOUT    seconds to wait for the children after INT/TERM before SIGKILL (default 20)
#
# Ctrl-C / SIGTERM: both children get the same signal, are waited for, exit 0.
# If one child dies on its own, the other is stopped and the script exits non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${SLUICE_PY:-.venv/bin/python}
RUN_ADDR=${RUN_ADDR:-127.0.0.1:8000}
STOP_TIMEOUT=${STOP_TIMEOUT:-20}
[ -x "$PY" ] || { echo "[run] $PY not found: run 'make venv' (scripts/bootstrap.sh) first" >&2; exit 1; }

say() { printf '[run] %s\n' "$*" >&2; }

mkdir -p var
bash scripts/services.sh redis
"$PY" manage.py migrate --noinput
"$PY" manage.py sluice setup

# One Celery worker: the bootstep runs the pumps, the mover and the health heartbeat;
# -B embeds beat (purge, idle queues, error ingestion). Demo traffic unless DEMO=0.
export SLUICE_DEMO_TRAFFIC=1
[ "${DEMO:-1}" = 0 ] && export SLUICE_DEMO_TRAFFIC=0
worker_cmd=(.venv/bin/celery -A workers worker -B --pool=threads --concurrency=2 --loglevel=info
            --schedule=var/celerybeat-schedule --hostname="sluice@%h")
# --insecure: serve static files (admin, dashboard assets) although DEBUG is off.
web_cmd=("$PY" manage.py runserver "$RUN_ADDR" --noreload --insecure)

# Job control puts each child in its own process group: a terminal Ctrl-C reaches
# only this script, which forwards exactly one signal to each child. (Without it,
# bash starts background children with SIGINT ignored, and Python would never see it.)
set -m

web_pid=
worker_pid=

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# stop_children SIGNAL: signal both, wait up to STOP_TIMEOUT s, then SIGKILL stragglers.
stop_children() {
    local sig=$1 pid i
    for pid in $web_pid $worker_pid; do
        if alive "$pid"; then kill -s "$sig" "$pid" 2>/dev/null || true; fi
    done
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        alive "$web_pid" || alive "$worker_pid" || break
        sleep 0.1
    done
    for pid in $web_pid $worker_pid; do
        if alive "$pid"; then
            say "pid $pid did not stop within ${STOP_TIMEOUT}s; killing it"
            kill -s KILL "$pid" 2>/dev/null || true
        fi
    done
    wait 2>/dev/null || true
}

# shellcheck disable=SC2317  # invoked from the traps below
on_signal() {
    trap '' INT TERM HUP
    say "received SIG$1: stopping web server and worker"
    local fwd=$1
    [ "$fwd" = HUP ] && fwd=TERM
    stop_children "$fwd"
    say "stopped"
    exit 0
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

"${web_cmd[@]}" &
web_pid=$!
"${worker_cmd[@]}" &
worker_pid=$!

say "web dashboard: http://$RUN_ADDR/  (admin: http://$RUN_ADDR/admin/)"
say "worker: celery worker + beat (pid $worker_pid; its log is this terminal; demo traffic: $SLUICE_DEMO_TRAFFIC)"
say "status: .venv/bin/python manage.py sluice status"
say "database: ${DATABASE_URL:-sqlite:///var/sluice.sqlite3}"
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
