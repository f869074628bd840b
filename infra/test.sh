#!/usr/bin/env bash
# The whole suite. With a reachable local Postgres and Redis (or DATABASE_URL, DATABASE_OWNER_URL
# and REDIS_URL set), the full suite runs on them; then every test not marked `postgres` or `redis`
# runs again on embedded SQLite, where the ORM layer is the only tenant scoping (no row-level
# security), so a leak in that layer shows. Under CI=true a missing Postgres or Redis is a failure,
# never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
mkdir -p test-artifacts

# Finds Postgres and Redis (sets DATABASE_URL / REDIS_URL) and defines pg_up / redis_up.
source infra/services.sh
if [ "${CI:-}" = "true" ]; then
  [ -n "${DATABASE_URL:-}" ] && pg_up "$DATABASE_URL" || { echo "CI: Postgres is required and unreachable" >&2; exit 1; }
  [ -n "${DATABASE_OWNER_URL:-}" ] && pg_up "$DATABASE_OWNER_URL" || { echo "CI: the owner role (DATABASE_OWNER_URL) is required and unreachable" >&2; exit 1; }
  [ -n "${REDIS_URL:-}" ] && redis_up "$REDIS_URL" || { echo "CI: Redis is required and unreachable" >&2; exit 1; }
fi
echo "== lint"
$BIN/ruff check .
$BIN/ruff format --check .
$BIN/mypy  # [tool.mypy] in pyproject.toml: the apps and the SDK, with the Django and DRF plugins
echo "== full suite on $(describe_services)"
export SAGAPLANE_DATA_DIR="${SAGAPLANE_TEST_DATA_DIR:-$PWD/test-artifacts/data}"
$BIN/python -m pytest "$@"
echo "== every test not marked postgres or redis, on embedded SQLite"
env -u DATABASE_URL -u DATABASE_OWNER_URL -u REDIS_URL SAGAPLANE_DATA_DIR="$PWD/test-artifacts/data-embedded" \
  $BIN/python -m pytest -m "not postgres and not redis" -q -p no:cacheprovider
