#!/usr/bin/env bash
# The whole suite. With a reachable local Postgres and Redis (or DATABASE_URL / REDIS_URL set),
# the full suite runs on them; then the smoke subset runs again on embedded SQLite so embedded
# mode keeps working. Under CI=true a missing Postgres or Redis is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
mkdir -p test-artifacts

# Finds Postgres and Redis (sets DATABASE_URL / REDIS_URL) and defines pg_up / redis_up.
source infra/services.sh
if [ "${CI:-}" = "true" ]; then
  [ -n "${DATABASE_URL:-}" ] && pg_up "$DATABASE_URL" || { echo "CI: Postgres is required and unreachable" >&2; exit 1; }
  [ -n "${REDIS_URL:-}" ] && redis_up "$REDIS_URL" || { echo "CI: Redis is required and unreachable" >&2; exit 1; }
fi
echo "== lint"
$BIN/ruff check .
$BIN/ruff format --check .
echo "== full suite on $(describe_services)"
export SAGAPLANE_DATA_DIR="${SAGAPLANE_TEST_DATA_DIR:-$PWD/test-artifacts/data}"
$BIN/python -m pytest "$@"
echo "== smoke subset on embedded SQLite"
env -u DATABASE_URL -u REDIS_URL SAGAPLANE_DATA_DIR="$PWD/test-artifacts/data-embedded" \
  $BIN/python -m pytest -m smoke -q -p no:cacheprovider
