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
# What a person opens: a host name, since passkeys (WebAuthn) refuse an IP address as relying party.
SHOWN_URL="http://localhost:${PORT}"

$BIN/python manage.py migrate --noinput -v0
$BIN/python manage.py seed_demo

# Each background job runs in a process group of its own (job control): whatever a job leaves
# behind is stopped with it, and nothing outside this script is signalled.
set -m
agents=""
running_of() {  # running_of PID...: those still running
  local running
  running=" $(jobs -pr | tr '\n' ' ')"
  for pid in "$@"; do case "$running" in *" $pid "*) printf '%s ' "$pid" ;; esac; done
}
stop_jobs() {  # stop_jobs SECONDS PID...: SIGTERM each job's own process, then wait, bounded
  local seconds="$1" left
  shift
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 $((seconds * 5))); do
    left="$(running_of "$@")"
    [ -z "$left" ] && return 0
    sleep 0.2
  done
  for pid in $left; do
    echo "stop: $(ps -o args= -p "$pid" 2>/dev/null || echo "process $pid") did not stop within $seconds s: killed" >&2
  done
}
stop_all() {
  # A second signal while stopping is ignored, not fatal: `make run` sends SIGTERM again to the
  # script it ran when it is itself terminated, and the shell dying here would leave every job
  # running. The stop is bounded anyway (the jobs are killed after their grace).
  trap - EXIT
  trap '' INT TERM
  local groups others=""
  groups="$(jobs -p)"
  for pid in $groups; do case " $agents " in *" $pid "*) ;; *) others="$others $pid" ;; esac; done
  # The demo agents first, while the server still takes their last records; then the server,
  # which answers its open long-polls and exits, and Celery, whose warm shutdown lets a running
  # task reach a safe point and stops its pool itself.
  # shellcheck disable=SC2086  # one word per process
  if [ -n "$agents" ]; then stop_jobs 5 $agents; fi
  # shellcheck disable=SC2086  # one word per process
  stop_jobs 10 $others
  for pid in $groups; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
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
  agents="$agents $!"
fi
# A second agent, an MCP client whose tool calls go through `sagaplane mcp-gateway` (its sagas are
# the "mcp-shop-agent" ones in the dashboard).
if [ -f sdk/examples/mcp_demo_agent.py ]; then
  SAGAPLANE_URL="$URL" SAGAPLANE_API_KEY="$(cat "$SAGAPLANE_DATA_DIR/demo_api_key")" \
    SAGAPLANE_WAL_DIR="$SAGAPLANE_DATA_DIR/mcp-demo-agent" \
    $BIN/python sdk/examples/mcp_demo_agent.py --forever >"$SAGAPLANE_DATA_DIR/mcp-demo-agent.log" 2>&1 &
  agents="$agents $!"
fi
echo
echo "Sagaplane is running at ${SHOWN_URL}/"
echo "Sign in as owner@demo.sagaplane.local with password sagaplane-demo (Ctrl-C to stop)"
wait "$server"
