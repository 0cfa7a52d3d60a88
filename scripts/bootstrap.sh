#!/usr/bin/env bash
# Idempotent developer/CI set-up: system libraries, .venv, editable install of the
# project with every extra the tests exercise, .[test,docs,mssql,pipeline,otel,tasks] (re-run
# only when pyproject.toml or the set of packages changed). A run with nothing to do
# takes about a second.
#
#   bash scripts/bootstrap.sh
#
# Environment:
#   SLUICE_PYTHON   interpreter to build .venv with (default: python3.11, else python3 >= 3.11)
#   SLUICE_FORCE_INSTALL=1   re-run pip install even if pyproject.toml is unchanged
set -euo pipefail
SLUICE_LOG_TAG=bootstrap
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SLUICE_ROOT"

VENV=.venv
STAMP="$VENV/.sluice-install-stamp"
# The dev/CI venv has every extra the tests exercise (the clean-install smoke test builds
# its own venvs without them: tests/test_clean_install.py).
EXTRAS=test,docs,mssql,pipeline,otel,tasks

# --- system packages -------------------------------------------------------------
# pyodbc (imported by mssql-django at import time) needs libodbc.so.2.
apt_install libodbc2 unixodbc
# The otel_cost benchmark's instruction counts (and their test) run drains under callgrind.
apt_install valgrind
# PySpark needs a JVM; only when the project depends on it.
if grep -qi 'pyspark' pyproject.toml && ! command -v java >/dev/null 2>&1; then
    apt_install openjdk-17-jre-headless
fi

# --- virtualenv --------------------------------------------------------------------
is_py311_plus() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; }

pick_python() {
    if [ -n "${SLUICE_PYTHON:-}" ]; then
        is_py311_plus "$SLUICE_PYTHON" || die "SLUICE_PYTHON=$SLUICE_PYTHON is not Python >= 3.11"
        echo "$SLUICE_PYTHON"; return
    fi
    local c
    for c in python3.11 python3; do
        if command -v "$c" >/dev/null 2>&1 && is_py311_plus "$c"; then
            echo "$c"; return
        fi
    done
    die "no Python >= 3.11 found (tried python3.11, python3); install python3.11 with venv and pip"
}

if [ -e "$VENV" ] && ! is_py311_plus "$VENV/bin/python"; then
    log "$VENV is broken or too old; recreating it"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    py="$(pick_python)"
    log "creating $VENV with $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
    "$py" -m venv "$VENV" || die "'$py -m venv' failed (on Debian: apt-get install python3-venv)"
    rm -f "$STAMP"
fi

# --- project install (only when pyproject.toml or the package layout changed) ----------
# The editable install records, at install time, which directories are packages and
# which are namespace packages (no __init__.py yet). Adding an __init__.py later
# leaves a stale mapping (Django then sees two paths for the app), so the set of
# __init__.py files is part of the stamp too.
layout="$(find . -mindepth 1 \( -path ./.venv -o -path ./.venv-django61 -o -path ./.git -o -path ./var -o -path ./node_modules \
          -o -path ./build -o -name '*.egg-info' \) -prune -o -name __init__.py -print | LC_ALL=C sort | sha256sum | cut -d' ' -f1)"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $layout $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])')"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ] || [ "${SLUICE_FORCE_INSTALL:-0}" = 1 ]; then
    log "installing the project into $VENV (pip install -e '.[$EXTRAS]'; a fresh install takes a minute or two)"
    "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip --upgrade
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q -e ".[$EXTRAS]"
    printf '%s\n' "$want" > "$STAMP"
    log "done"
else
    log "up to date ($VENV, system packages)"
fi
