#!/usr/bin/env bash
# The Django 6.1 leg: a second venv (.venv-django61) on Python 3.12 with Django 6.1 from
# the index, then the Django tasks backend's tests (django.tasks, built into Django 6),
# Django's own tests of django.tasks run against Sluice's backend, the own-project test
# (the wheel in a fresh project: SQLite only) and a smoke set of the rest, on SQLite (and
# PostgreSQL with LEG_PG=1, or when LEG_PG_URL is given).  `make test` runs it beside its
# passes (the Makefile's test target).  Without a Python 3.12 it says so and exits 2: it
# never passes silently.
#
#   bash scripts/django61_leg.sh                  # SQLite
#   LEG_PG=1 bash scripts/django61_leg.sh         # SQLite, then PostgreSQL
#
# Exit status: 0 passed, 1 failed, 2 not run (no Python 3.12).  Prints each pass's time and
# the leg's ("django61 timing: ..."), as make test reports them.
#
# Environment:
#   SLUICE_PYTHON312   the interpreter (default: python3.12 on PATH, else ~/.pyenv/versions/3.12*/bin/python)
#   LEG_SQLITE_URL     default sqlite:///var/django61.sqlite3
#   LEG_PG_URL         default postgresql://sluice:sluice@127.0.0.1:5432/sluice_django61
#   LEG_REDIS_URL      default redis://127.0.0.1:6379/14
#   LEG_PYTEST_ARGS    extra pytest arguments
set -euo pipefail
SLUICE_LOG_TAG=django61
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SLUICE_ROOT"

VENV=.venv-django61
STAMP="$VENV/.sluice-install-stamp"
DJANGO_SPEC="django>=6.1,<6.2"

is_py312_plus() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }

find_python312() {
    if [ -n "${SLUICE_PYTHON312:-}" ]; then
        is_py312_plus "$SLUICE_PYTHON312" && { echo "$SLUICE_PYTHON312"; return 0; }
        return 1
    fi
    local c
    if c="$(command -v python3.12 2>/dev/null)" && is_py312_plus "$c"; then
        echo "$c"; return 0
    fi
    for c in "$HOME"/.pyenv/versions/3.12*/bin/python; do
        if [ -x "$c" ] && is_py312_plus "$c"; then
            echo "$c"; return 0
        fi
    done
    return 1
}

if ! py="$(find_python312)"; then
    log "NOT RUN: no Python 3.12 found (tried \$SLUICE_PYTHON312, python3.12 on PATH, ~/.pyenv/versions/3.12*/bin/python);"
    log "the Django 6.1 leg needs Python >= 3.12 (Django 6 requires it). Install one, e.g. pyenv install 3.12."
    exit 2
fi

if [ ! -x "$VENV/bin/python" ] || ! is_py312_plus "$VENV/bin/python"; then
    rm -rf "$VENV"
    log "creating $VENV with $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
    "$py" -m venv "$VENV"
    rm -f "$STAMP"
fi
# Re-installed when pyproject.toml changes.  No [tasks] extra: Django 6 has django.tasks
# built in.  django-tasks-db for the benchmark and its compat; [test] for pytest.
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $DJANGO_SPEC"
if [ "$want" != "$(cat "$STAMP" 2>/dev/null || true)" ]; then
    log "installing the project with $DJANGO_SPEC into $VENV (a minute or two)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q -e ".[test]" "$DJANGO_SPEC"
    printf '%s\n' "$want" > "$STAMP"
fi
version="$("$VENV/bin/python" -c 'import django; print(django.get_version())')"
case "$version" in
    6.1*) log "Django $version on $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])')" ;;
    *) die "expected Django 6.1 in $VENV, found $version" ;;
esac

# Kept small (make test's whole run must stay well under 20 minutes on two cores): the
# backend's tests, Django's own django.tasks tests on Sluice's backend, the model-based test,
# the docs page's example, and a smoke set of the engine, the failed-message workflow and
# the dashboard.  On SQLite also the own-project test (a fresh project with the built wheel,
# which pip installs with Django 6.1 on this Python; its database is its own, so once is enough).
TESTS=(tests/test_tasks_backend.py tests/test_tasks_options.py tests/test_tasks_upstream.py tests/test_docs_tasks.py tests/test_model_based.py
       tests/test_transport.py tests/test_pump.py tests/test_failures.py
       tests/test_outbox.py tests/test_dashboard_pages.py tests/test_settings.py)
SQLITE_ONLY=(tests/test_django_project.py::test_a_new_project_on_sqlite_follows_the_page)

mkdir -p var
export DJANGO_ALLOW_ASYNC_UNSAFE=true
run_leg() {  # name, DATABASE_URL, extra tests...
    local name=$1 url=$2 started=$SECONDS status=0
    shift 2
    log "pytest on $name: ${TESTS[*]} $*"
    DATABASE_URL="$url" REDIS_URL="${LEG_REDIS_URL:-redis://127.0.0.1:6379/14}" \
        "$VENV/bin/python" -m pytest -q -p no:cacheprovider --basetemp="var/pytest-django61-$name" \
        ${LEG_PYTEST_ARGS:-} "${TESTS[@]}" "$@" || status=1
    timing+=("$name $((SECONDS - started)) s")
    return "$status"
}
status=0
timing=()
DATABASE_URL="${LEG_SQLITE_URL:-sqlite:///var/django61.sqlite3}" "$VENV/bin/python" manage.py check >/dev/null || status=1
run_leg sqlite "${LEG_SQLITE_URL:-sqlite:///var/django61.sqlite3}" "${SQLITE_ONLY[@]}" || status=1
if [ "${LEG_PG:-0}" = 1 ] || [ -n "${LEG_PG_URL:-}" ]; then
    run_leg postgresql "${LEG_PG_URL:-postgresql://sluice:sluice@127.0.0.1:5432/sluice_django61}" || status=1
fi
log "django61 timing: $(printf "%s, " "${timing[@]}")whole leg ${SECONDS} s (its venv included)"
if [ "$status" = 0 ]; then log "Django $version leg passed"; else log "Django $version leg FAILED"; fi
exit "$status"
