# Sluice: every public target does its own set-up (scripts/bootstrap.sh installs the
# venv and system libraries; scripts/services.sh installs/starts PostgreSQL, Redis and
# Chromium), so `make test` and `make run` work on a fresh Debian 12 machine.
#
#   make run                 migrate, set up, serve the dashboard (gunicorn; prints a login) + worker (Ctrl-C stops)
#   make test                lint, then pytest on SQLite and PostgreSQL at once (docs build and clean install included), and a Django 6.1 leg
#   make test-sqlite         pytest on SQLite only
#   make test-postgresql     pytest on PostgreSQL only
#   make bench               transport benchmark on SQLite and PostgreSQL
#   make lint                import-linter contracts, deptry (every run-time import is a declared dependency), ruff (pyflakes' checks)
#   make docs                serve the documentation site on http://127.0.0.1:8001 (DOCS_ADDR)
#   make docs-build          build it into var/site (mkdocs build --strict: broken links fail)
#   make venv                only the set-up (.venv, system packages)
#   make clean               remove var/ and caches (keeps .venv)
#
# Variables: PYTEST_ARGS="-k foo -x", BENCH_ARGS="...", PG_URL=postgresql://...,
#            TEST_SHARDS=2 (pytest processes per database in make test; 1: one each),
#            MSSQL_URL=mssql://... (make test also runs on that SQL Server; see
#            .github/workflows/sqlserver.yml), DEMO=0 (make run without demo traffic),
#            RUN_ADDR=127.0.0.1:8080 (where make run serves), DJANGO61=0 (make test
#            without the Django 6.1 leg), SLUICE_REQUIRE_DJANGO61=1 (fail when no Python 3.12).

SHELL := /bin/bash
.DEFAULT_GOAL := help
# Set-up steps call apt-get; never run them in parallel.
.NOTPARALLEL:

comma       := ,
VENV        := .venv
PY          := $(VENV)/bin/python
PYTEST      := $(VENV)/bin/pytest
PG_URL      ?= postgresql://sluice:sluice@127.0.0.1:5432/sluice
SQLITE_URL  ?= sqlite:///var/test-sqlite.sqlite3
MSSQL_URL   ?=
# make test runs each database's pass as TEST_SHARDS pytest processes, all at once, each
# on a Redis database of its own: TEST_REDIS/1, /2, … (scripts/test_passes.sh).  A part is
# a set of whole test files balanced on their times in the last run (tests/sharding.py):
# each file's fixtures start once, and its tests run in the order of an unsharded run.
# (Split test by test, 2 parts took 9-11 min instead of 13-22 on two cores, but a browser
# progress-bar test then failed in part 1, never alone nor unsharded.)
TEST_SHARDS ?= 2
TEST_REDIS  ?= redis://127.0.0.1:6379
PYTEST_ARGS ?=
BENCH_ARGS  ?=
DOCS_ADDR   ?= 127.0.0.1:8001

# Test/bench environment (PySpark binds oddly without SPARK_LOCAL_IP; Playwright's
# sync API runs an event loop in the test thread, next to pytest-django's live_server).
export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(CURDIR)/$(PY)
export DJANGO_ALLOW_ASYNC_UNSAFE := true

.PHONY: help venv run test test-sqlite test-postgresql bench soak mutate lint lint-only docs docs-build docs-build-only clean \
        services-all services-postgres services-test-sqlite

help:
	@sed -n 's/^#   make /  make /p' $(firstword $(MAKEFILE_LIST))

venv:
	@bash scripts/bootstrap.sh

run: venv
	@bash scripts/run.sh

services-all:
	@bash scripts/services.sh postgres redis chromium

services-test-sqlite:
	@bash scripts/services.sh redis chromium

services-postgres:
	@bash scripts/services.sh postgres

# Lint, then the pytest passes (PostgreSQL, the longest, SQLite, SQL Server with MSSQL_URL;
# the SQLite pass also builds the docs site strictly and installs the wheel into clean
# venvs: tests/test_docs.py, tests/test_clean_install.py),
# all at once, each in TEST_SHARDS parts started 15 s apart (scripts/test_passes.sh; a log
# of each part in var/test-NAME-K.log); runs them all even if one fails, fails if any failed.
# Beside them, DJANGO61_DELAY seconds in (after the parts' busy first minute), the Django 6.1
# leg: Python 3.12 and Django 6.1, a chosen set on SQLite then PostgreSQL
# (scripts/django61_leg.sh; log var/test-django61.log); its failure fails make test.  Without
# a Python 3.12 the summary says it did not run; SLUICE_REQUIRE_DJANGO61=1 (.ci/run) makes
# that a failure.  DJANGO61=0 leaves the leg out.
DJANGO61       ?= 1
DJANGO61_DELAY ?= 75
test: venv services-all
	@mkdir -p var
	@failed=""; leg_note=""; leg_said=""; \
	echo "== lint (import contracts, declared dependencies, pyflakes)"; \
	$(MAKE) --no-print-directory lint-only || failed="$$failed lint"; \
	if [ '$(DJANGO61)' = 1 ]; then \
		echo "== the Django 6.1 leg (Python 3.12) starts in $(DJANGO61_DELAY) s; log var/test-django61.log"; \
		( sleep '$(DJANGO61_DELAY)'; \
		  LEG_PG_URL='$(PG_URL)_django61' LEG_REDIS_URL='$(TEST_REDIS)/14' LEG_PYTEST_ARGS='$(PYTEST_ARGS)' \
		  bash scripts/django61_leg.sh 2>&1 | tee var/test-django61.log | sed -u 's/^/[django61] /'; \
		  exit "$${PIPESTATUS[0]}" ) & leg=$$!; \
	fi; \
	echo "== pytest on SQLite ($(SQLITE_URL)) and PostgreSQL ($(PG_URL))$(if $(MSSQL_URL), and SQL Server), at once"; \
	bash scripts/test_passes.sh --shards '$(TEST_SHARDS)' --redis '$(TEST_REDIS)' \
		'postgresql=$(PG_URL)' 'sqlite=$(SQLITE_URL)' $(if $(MSSQL_URL),'mssql=$(MSSQL_URL)') \
		-- $(PYTEST_ARGS) || failed="$$failed pytest"; \
	if [ '$(DJANGO61)' = 1 ]; then \
		wait "$$leg"; leg_status=$$?; \
		grep -h 'django61 timing' var/test-django61.log | tail -1 | sed 's/^\[django61\] /== /'; \
		case "$$leg_status" in \
			0) leg_note=", django 6.1 leg"; leg_said="; the Django 6.1 leg passed" ;; \
			2) echo "== Django 6.1 leg NOT RUN: no Python 3.12 found (scripts/django61_leg.sh)"; \
			   leg_note="; the Django 6.1 leg did NOT run (no Python 3.12)"; \
			   if [ "$${SLUICE_REQUIRE_DJANGO61:-0}" = 1 ]; then failed="$$failed django61(no-python3.12)"; fi ;; \
			*) failed="$$failed django61"; echo "== django61 FAILED (var/test-django61.log):"; \
			   sed -n '/short test summary info/,/passed\|failed\|error/p' var/test-django61.log ;; \
		esac; \
	else leg_note="; the Django 6.1 leg was left out (DJANGO61=0)"; fi; \
	if [ -n "$$failed" ]; then echo "== FAILED:$$failed$${leg_said:-$$leg_note}"; exit 1; fi; \
	echo "== all passed (lint, sqlite, postgresql$(if $(MSSQL_URL),$(comma) mssql)$$leg_note)"

test-sqlite: venv services-test-sqlite
	@mkdir -p var
	DATABASE_URL='$(SQLITE_URL)' $(PYTEST) $(PYTEST_ARGS)

test-postgresql: venv services-all
	DATABASE_URL='$(PG_URL)' $(PYTEST) $(PYTEST_ARGS)

bench: venv services-postgres
	@mkdir -p var
	@failed=""; \
	echo "== benchmark: sqlite"; \
	SLUICE_BENCH_POSTGRES_URL='$(PG_URL)' $(PY) -m benchmarks transport --db sqlite $(BENCH_ARGS) || failed="$$failed sqlite"; \
	echo "== benchmark: postgresql"; \
	SLUICE_BENCH_POSTGRES_URL='$(PG_URL)' $(PY) -m benchmarks transport --db postgresql $(BENCH_ARGS) || failed="$$failed postgresql"; \
	if [ -n "$$failed" ]; then echo "== FAILED:$$failed"; exit 1; fi

# The model-based test's long profile (benchmarks/soak.py) for SOAK_SECONDS on each of
# SOAK_DBS; one JSON line each.
SOAK_SECONDS ?= 600
SOAK_DBS     ?= postgresql
soak: venv services-postgres
	@for db in $(SOAK_DBS); do SLUICE_BENCH_POSTGRES_URL='$(PG_URL)' $(PY) -m benchmarks soak --db $$db --seconds $(SOAK_SECONDS) || exit 1; done

# Mutation testing of the guarantee code ([tool.mutmut] in pyproject.toml: which files,
# which tests), on SQLite; the report in docs/guarantees.md.  MUTATE_ARGS: mutant names or
# globs to run a part (e.g. 'core.savepoints*'); the first run maps tests to functions
# (kept in mutants/, reused by later parts).  One pytest at a time: the mutants share a
# test database (--reuse-db).
MUTATE_ARGS ?=
MUTATE_URL  ?= sqlite:///$(CURDIR)/var/mutate.sqlite3
mutate: venv
	@mkdir -p var
	DATABASE_URL='$(MUTATE_URL)' $(VENV)/bin/mutmut run --max-children 1 $(MUTATE_ARGS); \
	DATABASE_URL='$(MUTATE_URL)' $(VENV)/bin/mutmut results

lint: venv lint-only

# The checks alone, without the set-up (make test has done it).
lint-only:
	$(VENV)/bin/lint-imports
	$(VENV)/bin/deptry .
	$(VENV)/bin/ruff check --quiet .

docs: venv
	$(VENV)/bin/mkdocs serve --dev-addr '$(DOCS_ADDR)'

docs-build: venv docs-build-only

docs-build-only:
	$(VENV)/bin/mkdocs build --strict --site-dir var/site

clean:
	rm -rf var .pytest_cache test-results build htmlcov .coverage
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf
	find . -path ./$(VENV) -prune -o -name '*.py[co]' -type f -print0 | xargs -0 rm -f
