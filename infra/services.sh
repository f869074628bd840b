# Sourced by infra/test.sh and infra/bench.sh: find the local Postgres and Redis the way both expect.
# With DATABASE_URL / REDIS_URL already set, they are kept (set DATABASE_OWNER_URL beside a
# Postgres DATABASE_URL). Otherwise a reachable local Postgres (psql as the postgres superuser on
# 127.0.0.1) gets the two roles of core/rls.py and the database `sagaplane`: DATABASE_OWNER_URL
# as `sagaplane_owner` (runs migrations, owns the database and its tables) and DATABASE_URL as
# `sagaplane` (what the application and the tests run as: owns nothing, bound by row-level
# security); a Redis answering on 127.0.0.1:6379 becomes REDIS_URL. Nothing reachable: all stay
# unset (embedded SQLite).
# Defines pg_up URL and redis_up URL (exit 0 when reachable), redact_url URL and
# describe_services. Expects the repo root as cwd.
BIN="${BIN:-.venv/bin}"

pg_up() { $BIN/python - "$1" <<'PY'
import sys, psycopg
try:
    psycopg.connect(sys.argv[1], connect_timeout=3).close()
except Exception as exc:
    print(f"postgres unreachable: {exc}", file=sys.stderr); sys.exit(1)
PY
}
# A URL fit for a log: the password in its user-info replaced by *** (CI logs are public).
redact_url() {
  printf '%s' "$1" | sed -E -e 's#^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^/]*@#\1:***@#' \
    -e 's#([?&]password=)[^&]*#\1***#'
}
# What the run uses, for the log, never with a password.
describe_services() {
  if [ -n "${DATABASE_URL:-}" ]; then printf 'Postgres %s' "$(redact_url "$DATABASE_URL")"; else printf 'SQLite'; fi
  if [ -n "${DATABASE_OWNER_URL:-}" ]; then printf ' (owner %s)' "$(redact_url "$DATABASE_OWNER_URL")"; fi
  if [ -n "${REDIS_URL:-}" ]; then printf ' with Redis %s' "$(redact_url "$REDIS_URL")"; fi
  printf '\n'
}
redis_up() { $BIN/python -c "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=2).ping()" "$1"; }

if [ -z "${DATABASE_URL:-}" ]; then
  # Neither role is a superuser (superusers ignore row-level security). The owner creates the test
  # databases (CREATEDB); the runtime role needs nothing beyond LOGIN.
  if command -v psql >/dev/null && psql -h 127.0.0.1 -U postgres -Atc "SELECT 1" >/dev/null 2>&1; then
    psql -h 127.0.0.1 -U postgres -qc "DO \$\$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sagaplane_owner')
        THEN CREATE ROLE sagaplane_owner LOGIN CREATEDB PASSWORD 'sagaplane_owner'; END IF;
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sagaplane')
        THEN CREATE ROLE sagaplane LOGIN PASSWORD 'sagaplane'; END IF; END \$\$;" >/dev/null
    owner=$(psql -h 127.0.0.1 -U postgres -Atc "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'sagaplane'")
    if [ -z "$owner" ]; then
      psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE sagaplane OWNER sagaplane_owner" >/dev/null
    elif [ "$owner" != "sagaplane_owner" ]; then
      # A database from before the owner role: hand it and its tables over (migrate does the rest).
      psql -h 127.0.0.1 -U postgres -qc "ALTER DATABASE sagaplane OWNER TO sagaplane_owner" >/dev/null
      psql -h 127.0.0.1 -U postgres -d sagaplane -qc "DO \$\$ DECLARE t regclass; BEGIN
        FOR t IN SELECT c.oid FROM pg_class c WHERE c.relkind IN ('r', 'p')
          AND c.relnamespace = 'public'::regnamespace AND c.relowner <> 'sagaplane_owner'::regrole
        LOOP EXECUTE format('ALTER TABLE %s OWNER TO sagaplane_owner', t); END LOOP; END \$\$;" >/dev/null
    fi
    # A test database left by a run from before the owner role belongs to `sagaplane`: the owner
    # (who creates and drops test databases now) could neither drop nor reuse it. Hand it over.
    for leftover in $(psql -h 127.0.0.1 -U postgres -Atc "SELECT datname FROM pg_database
        WHERE datname LIKE 'test\_sagaplane%' AND pg_get_userbyid(datdba) <> 'sagaplane_owner'"); do
      psql -h 127.0.0.1 -U postgres -qc "ALTER DATABASE \"$leftover\" OWNER TO sagaplane_owner" >/dev/null
    done
    export DATABASE_URL="postgres://sagaplane:sagaplane@127.0.0.1:5432/sagaplane"
    export DATABASE_OWNER_URL="postgres://sagaplane_owner:sagaplane_owner@127.0.0.1:5432/sagaplane"
  fi
fi
if [ -z "${REDIS_URL:-}" ] && redis_up redis://127.0.0.1:6379/0 2>/dev/null; then
  export REDIS_URL="redis://127.0.0.1:6379/0"
fi
