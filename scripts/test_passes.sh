#!/usr/bin/env bash
# The pytest passes of `make test`, all at once: each database's pass split into SHARDS
# pytest processes (SLUICE_TEST_SHARD=K/N: whole test files, balanced on the times the last
# run recorded in var/test-durations/; tests/sharding.py), all started together.
# Most of a pass's time is spent waiting (child processes starting,
# workers, Spark, a browser, polls): on two cores four processes at once take about
# half as long as one pass after the other.
#
#   bash scripts/test_passes.sh [--shards N] [--redis URL] [--redis-db FIRST] [--stagger S] \
#        NAME=DATABASE_URL [...] [-- PYTEST_ARGS...]
#
# --shards N      processes per pass (default 1: each pass as one pytest)
# --redis URL     the Redis server, without a database number (default redis://127.0.0.1:6379)
# --redis-db K    the first Redis database number to hand out (default 1); each process
#                 gets the next one (REDIS_URL: the dashboard cache, heartbeats, the bulk
#                 operations' task queue), so passes x shards must fit below 16
# --stagger S     start each process S seconds after the one before (default 15), in the
#                 order given (the longest pass first): a pytest's first minute (test
#                 databases, Chromium, Celery workers) is its busiest: spread them out
#
# Each process keeps to itself: its own test databases (test_<name>_partK), its own Redis
# database, its own pytest temporary directory (var/pytest-NAME-K).  Its output (with its 15
# slowest tests: where the minutes go) goes to var/test-NAME-K.log and, prefixed with [NAME-K], to this terminal as it comes.  At the
# end: each process's result line, the short summary of any that failed, and exit status
# 1 if any failed.
set -uo pipefail
SLUICE_LOG_TAG=test
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SLUICE_ROOT"

PYTEST=${PYTEST:-.venv/bin/pytest}
shards=1
redis=redis://127.0.0.1:6379
redis_db=1
stagger=15
passes=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --) shift; break ;;
        --shards) shards=$2; shift 2 ;;
        --redis) redis=${2%/}; shift 2 ;;
        --redis-db) redis_db=$2; shift 2 ;;
        --stagger) stagger=$2; shift 2 ;;
        *) passes+=("$1"); shift ;;
    esac
done
[ "${#passes[@]}" -gt 0 ] || die "usage: $0 [--shards N] [--redis URL] [--redis-db K] [--stagger S] NAME=DATABASE_URL [...] [-- PYTEST_ARGS...]"
[ "$shards" -ge 1 ] 2>/dev/null || die "--shards wants a whole number >= 1, not '$shards'"
mkdir -p var

pids=()
names=()
delay=0
for spec in "${passes[@]}"; do
    pass=${spec%%=*}
    database_url=${spec#*=}
    for ((k = 1; k <= shards; k++)); do
        name=$pass-$k
        redis_url=$redis/$redis_db
        redis_db=$((redis_db + 1))
        log "pytest $name: part $k of $shards on $database_url, $redis_url, in ${delay}s; log var/test-$name.log"
        (
            sleep "$delay"
            # The part's own exit status, not tee's or sed's.
            SLUICE_TEST_SHARD=$k/$shards DATABASE_URL=$database_url REDIS_URL=$redis_url \
                "$PYTEST" --basetemp="var/pytest-$name" --durations=15 "$@" 2>&1 \
                | tee "var/test-$name.log" | sed -u "s/^/[$name] /"
            exit "${PIPESTATUS[0]}"
        ) &
        pids+=("$!")
        names+=("$name")
        delay=$((delay + stagger))
    done
done

# Ctrl-C or a CI cancel: stop the parts (each is a subshell whose pytest is its child).
trap 'for p in "${pids[@]}"; do pkill -TERM -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done; exit 130' INT TERM

failed=()
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed+=("${names[$i]}")
done

echo
for name in "${names[@]}"; do
    echo "== $name: $(grep -E '(passed|failed|errors?|skipped|deselected|no tests ran).* in [0-9.]+s' "var/test-$name.log" \
                         | tail -1 | sed 's/^=* *//; s/ *=*$//')"
done
for name in "${failed[@]}"; do
    echo "== $name FAILED (var/test-$name.log):"
    sed -n '/^=* short test summary info =*$/,$p' "var/test-$name.log"
done
[ "${#failed[@]}" -eq 0 ] || { echo "== FAILED: ${failed[*]}"; exit 1; }
