#!/usr/bin/env bash
# The whole suite. With a reachable local Postgres and Redis (or DATABASE_URL, DATABASE_OWNER_URL
# and REDIS_URL set), the full suite runs on them; then every test not marked `postgres` or `redis`
# runs again on embedded SQLite, where the ORM layer is the only tenant scoping (no row-level
# security), so a leak in that layer shows. Under CI=true a missing Postgres or Redis is a failure,
# never a skip. The system packages the suite needs (Chromium, nginx) are installed first when the
# run may (root with apt-get), otherwise it stops at once naming them (infra/prerequisites.sh).
# Every phase runs even when one before it failed; the command fails at the end if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-.venv/bin}"
mkdir -p test-artifacts

source infra/prerequisites.sh
ensure_prerequisites || exit 1

# Finds Postgres and Redis (sets DATABASE_URL / REDIS_URL) and defines pg_up / redis_up.
source infra/services.sh
if [ "${CI:-}" = "true" ]; then
  [ -n "${DATABASE_URL:-}" ] && pg_up "$DATABASE_URL" || { echo "CI: Postgres is required and unreachable" >&2; exit 1; }
  [ -n "${DATABASE_OWNER_URL:-}" ] && pg_up "$DATABASE_OWNER_URL" || { echo "CI: the owner role (DATABASE_OWNER_URL) is required and unreachable" >&2; exit 1; }
  [ -n "${REDIS_URL:-}" ] && redis_up "$REDIS_URL" || { echo "CI: Redis is required and unreachable" >&2; exit 1; }
fi
failed=()
phase() {  # phase NAME COMMAND...: run it, remember a failure, go on
  local name="$1"
  shift
  "$@" || { echo "== $name FAILED" >&2; failed+=("$name"); }
}
lint() {
  # [tool.mypy] in pyproject.toml: the apps and the SDK; [tool.vulture]: dead code
  $BIN/ruff check . && $BIN/ruff format --check . && $BIN/mypy && $BIN/vulture
}
echo "== lint"
phase lint lint
echo "== full suite on $(describe_services)"
export SAGAPLANE_DATA_DIR="${SAGAPLANE_TEST_DATA_DIR:-$PWD/test-artifacts/data}"
# The slowest tests are listed after each phase: CI must stay well under its 90 minutes.
phase "full suite on $(describe_services)" $BIN/python -m pytest --durations=25 "$@"
echo "== every test not marked postgres or redis, on embedded SQLite"
phase "embedded SQLite" env -u DATABASE_URL -u DATABASE_OWNER_URL -u REDIS_URL \
  SAGAPLANE_DATA_DIR="$PWD/test-artifacts/data-embedded" \
  $BIN/python -m pytest -m "not postgres and not redis" -q -p no:cacheprovider --durations=25
if [ ${#failed[@]} -gt 0 ]; then
  printf '== failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "== all passed"
