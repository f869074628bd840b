#!/usr/bin/env bash
# The control plane on embedded defaults (SQLite, filesystem broker, in-memory channel layer),
# with the demo tenant seeded and the demo agent sending live sagas. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export SAGAPLANE_DATA_DIR="${SAGAPLANE_DATA_DIR:-$PWD/.sagaplane-data}"
unset DATABASE_URL DATABASE_OWNER_URL REDIS_URL
PORT="${PORT:-8000}"
URL="http://127.0.0.1:${PORT}"

$BIN/python manage.py migrate --noinput -v0
$BIN/python manage.py seed_demo

stop_all() {
  trap - EXIT INT TERM
  # Celery's warm shutdown waits for running tasks; give it a moment, then make sure it is gone.
  kill -TERM $(jobs -p) 2>/dev/null || true
  for _ in $(seq 1 50); do [ -z "$(jobs -pr)" ] && break; sleep 0.2; done
  kill -KILL 0 2>/dev/null || true
}
trap stop_all EXIT INT TERM
$BIN/celery -A controlplane worker -B --loglevel=WARNING --concurrency=2 \
  --schedule="$SAGAPLANE_DATA_DIR/celerybeat-schedule" &
$BIN/python manage.py runserver "127.0.0.1:${PORT}" --noreload &
server=$!

# Wait for the server to answer (bounded), then start the demo agent against it.
for _ in $(seq 1 300); do
  if $BIN/python -c "import urllib.request,sys; urllib.request.urlopen('${URL}/healthz', timeout=1)" 2>/dev/null; then
    break
  fi
  kill -0 "$server" 2>/dev/null || { echo "the server exited during start-up" >&2; exit 1; }
  $BIN/python -c "import time; time.sleep(0.2)"
done
if [ -f sdk/examples/demo_agent.py ]; then
  SAGAPLANE_URL="$URL" SAGAPLANE_API_KEY="$(cat "$SAGAPLANE_DATA_DIR/demo_api_key")" \
    SAGAPLANE_WAL_DIR="$SAGAPLANE_DATA_DIR/demo-agent" \
    $BIN/python sdk/examples/demo_agent.py --forever >"$SAGAPLANE_DATA_DIR/demo-agent.log" 2>&1 &
fi
# A second agent, an MCP client whose tool calls go through `sagaplane mcp-gateway` (its sagas are
# the "mcp-shop-agent" ones in the dashboard).
if [ -f sdk/examples/mcp_demo_agent.py ]; then
  SAGAPLANE_URL="$URL" SAGAPLANE_API_KEY="$(cat "$SAGAPLANE_DATA_DIR/demo_api_key")" \
    SAGAPLANE_WAL_DIR="$SAGAPLANE_DATA_DIR/mcp-demo-agent" \
    $BIN/python sdk/examples/mcp_demo_agent.py --forever >"$SAGAPLANE_DATA_DIR/mcp-demo-agent.log" 2>&1 &
fi
echo
echo "Sagaplane is running at ${URL}/"
echo "Sign in as owner@demo.sagaplane.local with password sagaplane-demo (Ctrl-C to stop)"
wait "$server"
