#!/usr/bin/env bash
# The whole suite. With a reachable local Postgres and Redis (or DATABASE_URL / REDIS_URL set),
# the full suite runs on them; then the smoke subset runs again on embedded SQLite so embedded
# mode keeps working. Under CI=true a missing Postgres or Redis is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
mkdir -p test-artifacts

pg_up() { $BIN/python - "$1" <<'PY'
import sys, psycopg
try:
    psycopg.connect(sys.argv[1], connect_timeout=3).close()
except Exception as exc:
    print(f"postgres unreachable: {exc}", file=sys.stderr); sys.exit(1)
PY
}
redis_up() { $BIN/python -c "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=2).ping()" "$1"; }

if [ -z "${DATABASE_URL:-}" ]; then
  # The application role must not be a superuser: superusers ignore row-level security.
  if command -v psql >/dev/null && psql -h 127.0.0.1 -U postgres -Atc "SELECT 1" >/dev/null 2>&1; then
    psql -h 127.0.0.1 -U postgres -qc "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sagaplane')
      THEN CREATE ROLE sagaplane LOGIN CREATEDB PASSWORD 'sagaplane'; END IF; END \$\$;" >/dev/null
    psql -h 127.0.0.1 -U postgres -Atc "SELECT 1 FROM pg_database WHERE datname = 'sagaplane'" | grep -q 1 ||
      psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE sagaplane OWNER sagaplane" >/dev/null
    export DATABASE_URL="postgres://sagaplane:sagaplane@127.0.0.1:5432/sagaplane"
  fi
fi
if [ -z "${REDIS_URL:-}" ] && redis_up redis://127.0.0.1:6379/0 2>/dev/null; then
  export REDIS_URL="redis://127.0.0.1:6379/0"
fi
if [ "${CI:-}" = "true" ]; then
  [ -n "${DATABASE_URL:-}" ] && pg_up "$DATABASE_URL" || { echo "CI: Postgres is required and unreachable" >&2; exit 1; }
  [ -n "${REDIS_URL:-}" ] && redis_up "$REDIS_URL" || { echo "CI: Redis is required and unreachable" >&2; exit 1; }
fi
echo "== lint"
$BIN/ruff check .
echo "== full suite on ${DATABASE_URL:+Postgres}${DATABASE_URL:-SQLite} ${REDIS_URL:+with Redis}"
export SAGAPLANE_DATA_DIR="${SAGAPLANE_TEST_DATA_DIR:-$PWD/test-artifacts/data}"
$BIN/python -m pytest "$@"
echo "== smoke subset on embedded SQLite"
env -u DATABASE_URL -u REDIS_URL SAGAPLANE_DATA_DIR="$PWD/test-artifacts/data-embedded" \
  $BIN/python -m pytest -m smoke -q -p no:cacheprovider
