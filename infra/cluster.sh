#!/usr/bin/env bash
# A multi-replica deployment on one machine: nginx (Debian's package) balancing WEB_REPLICAS web
# replicas (gunicorn with uvicorn workers, infra/gunicorn.conf.py), CELERY_WORKERS Celery workers
# and exactly one beat, on Postgres and Redis. The same script serves a person trying it and the
# fault tests (tests/hostile/test_cluster.py).
#
#   infra/cluster.sh up        migrate (as the owner role), collectstatic, start everything, wait
#                              until nginx answers /readyz
#   infra/cluster.sh down      SIGTERM everything (web replicas drain in-flight requests, workers
#                              finish or hand back their tasks), SIGKILL what is left after 60 s
#   infra/cluster.sh status    each process (alive or not) and each replica's /readyz
#   infra/cluster.sh start|stop|kill|restart NAME
#                              one process: web-N, worker-N, beat or nginx (kill is SIGKILL)
#   infra/cluster.sh url web-N the replica's own address (to scrape /metrics, probe /readyz)
#
# Network namespaces (SAGAPLANE_CLUSTER_NETNS=1 at `up`, as root, with `ip` and `socat`): every
# web replica, worker and beat runs in its own namespace (sagaplane-$CLUSTER_PORT-NAME) joined to
# the host by a veth pair on a private /30 ($CLUSTER_NETNS_NET.0/24, default 10.<port>/16 split
# by the port's two bytes), so what crosses between them really crosses a network: nginx reaches
# each replica at its namespace's address, and each process reaches Postgres and Redis through a
# socat forwarder on the host side of its own veth (bound to that address only), which connects
# to DATABASE_URL's and REDIS_URL's host and port; the process's URLs name the forwarder. The
# servers themselves are not reconfigured (they may listen on 127.0.0.1 only). Nothing else is
# routed out of a namespace: outbound webhooks, Slack, OTLP or S3 from a replica need a route and
# NAT this script does not set up. The mode is remembered in $CLUSTER_DIR for start/restart;
# `down` removes this cluster's namespaces, veths and forwarders, found by name and address even
# when the processes were killed and their pid files are stale.
#
# Settings come from the environment as in production (README, "Running in production mode").
# Missing DATABASE_URL / REDIS_URL are found as `make test` finds them (infra/services.sh);
# missing SECRET_KEY / SAGAPLANE_MASTER_KEY are generated once into $CLUSTER_DIR/secrets.env.
# nginx listens on 127.0.0.1:$CLUSTER_PORT (default 8080) and terminates no TLS: put TLS in front
# of it (SECURE_SSL_REDIRECT is off here unless set). /metrics is not proxied: scrape each replica
# on its own port with SAGAPLANE_METRICS_TOKEN.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="${BIN:-$ROOT/.venv/bin}"
CLUSTER_DIR="$(mkdir -p "${CLUSTER_DIR:-$ROOT/.sagaplane-cluster}" && cd "${CLUSTER_DIR:-$ROOT/.sagaplane-cluster}" && pwd)"
CLUSTER_PORT="${CLUSTER_PORT:-8080}"
WEB_REPLICAS="${WEB_REPLICAS:-2}"
CELERY_WORKERS="${CELERY_WORKERS:-2}"
WEB_BASE_PORT="${WEB_BASE_PORT:-$((CLUSTER_PORT + 1))}"
WEB_CONCURRENCY="${WEB_CONCURRENCY:-2}"
NGINX="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"
CLUSTER_NETNS_NET="${CLUSTER_NETNS_NET:-10.$((CLUSTER_PORT >> 8)).$((CLUSTER_PORT & 255))}"
mkdir -p "$CLUSTER_DIR"/{pids,logs,nginx,metrics,data}

environment() {
  BIN="$BIN" source infra/services.sh
  if [ ! -f "$CLUSTER_DIR/secrets.env" ]; then
    umask 077
    "$BIN/python" - >"$CLUSTER_DIR/secrets.env" <<'PY'
import secrets
from cryptography.fernet import Fernet
print(f"SECRET_KEY={secrets.token_urlsafe(50)}")
print(f"SAGAPLANE_MASTER_KEY={Fernet.generate_key().decode()}")
PY
  fi
  set -a
  # shellcheck disable=SC1091
  source "$CLUSTER_DIR/secrets.env"
  set +a
  export SECRET_KEY="${SECRET_KEY}" SAGAPLANE_MASTER_KEY="${SAGAPLANE_MASTER_KEY}"
  export SAGAPLANE_ENV="${SAGAPLANE_ENV:-production}"
  export ALLOWED_HOSTS="${ALLOWED_HOSTS:-127.0.0.1,localhost}"
  export SAGAPLANE_WEBAUTHN_RP_ID="${SAGAPLANE_WEBAUTHN_RP_ID:-localhost}"
  export SAGAPLANE_WEBAUTHN_ORIGINS="${SAGAPLANE_WEBAUTHN_ORIGINS:-https://localhost:$CLUSTER_PORT}"
  export CSRF_TRUSTED_ORIGINS="${CSRF_TRUSTED_ORIGINS:-http://127.0.0.1:$CLUSTER_PORT}"
  export SAGAPLANE_PUBLIC_URL="${SAGAPLANE_PUBLIC_URL:-https://127.0.0.1:$CLUSTER_PORT}"
  export SECURE_SSL_REDIRECT="${SECURE_SSL_REDIRECT:-false}"
  export SAGAPLANE_DATA_DIR="${SAGAPLANE_DATA_DIR:-$CLUSTER_DIR/data}"
  export STATIC_ROOT="${STATIC_ROOT:-$CLUSTER_DIR/data/static}"
  export PYTHONUNBUFFERED=1
  export DJANGO_SETTINGS_MODULE=controlplane.settings
}

names() {
  for i in $(seq 1 "$WEB_REPLICAS"); do echo "web-$i"; done
  for i in $(seq 1 "$CELERY_WORKERS"); do echo "worker-$i"; done
  echo beat
  echo nginx
}

pid_of() { cat "$CLUSTER_DIR/pids/$1.pid" 2>/dev/null || true; }
# Alive while any process of its group is (a gunicorn worker outliving its master still holds the port).
alive() { local pid; pid=$(pid_of "$1"); [ -n "$pid" ] && kill -0 -- "-$pid" 2>/dev/null; }
web_port() { echo $((WEB_BASE_PORT + ${1#web-} - 1)); }
web_host() { if netns_on; then ns_addr "$1"; else echo 127.0.0.1; fi; }
web_url() { echo "http://$(web_host "$1"):$(web_port "$1")"; }

# ------------------------------------------------------------------ network namespaces (optional)

netns_on() { [ -f "$CLUSTER_DIR/netns" ]; }
ns_name() { echo "sagaplane-$CLUSTER_PORT-$1"; }
slot() {  # NAME: its /30 within $CLUSTER_NETNS_NET.0/24 (web 1-31, workers 32-62, beat 63)
  case "$1" in
    web-*) echo "${1#web-}" ;;
    worker-*) echo $((31 + ${1#worker-})) ;;
    beat) echo 63 ;;
  esac
}
host_addr() { echo "$CLUSTER_NETNS_NET.$((4 * $(slot "$1") + 1))"; }
ns_addr() { echo "$CLUSTER_NETNS_NET.$((4 * $(slot "$1") + 2))"; }
veth() { echo "sp$CLUSTER_PORT$2$(slot "$1")"; }  # NAME h|n: the host or namespace end (<= 15 chars)

netns_usable() {  # why not, on stderr
  if [ "$(id -u)" != 0 ]; then echo "network namespaces need root (ip netns add)" >&2; return 1; fi
  if ! command -v ip >/dev/null; then echo "network namespaces need iproute2 (ip)" >&2; return 1; fi
  if ! command -v socat >/dev/null; then echo "network namespaces need socat (apt-get install socat)" >&2; return 1; fi
  if [ "$WEB_REPLICAS" -gt 31 ] || [ "$CELERY_WORKERS" -gt 31 ]; then
    echo "network namespaces: at most 31 web replicas and 31 workers" >&2; return 1
  fi
}

forwarded() {  # ADDR URL: "HOST PORT URL'" where URL' names ADDR:PORT instead of HOST:PORT
  "$BIN/python" - "$1" "$2" <<'PY'
import sys
from urllib.parse import urlsplit, urlunsplit

addr, url = sys.argv[1], sys.argv[2]
parts = urlsplit(url)
if not parts.hostname:
    sys.exit(f"{parts.scheme} URL without a host cannot be forwarded into a network namespace")
port = parts.port or {"postgres": 5432, "postgresql": 5432, "redis": 6379, "rediss": 6379}[parts.scheme]
userinfo = parts.netloc.rpartition("@")[0]
netloc = f"{userinfo}@{addr}:{port}" if userinfo else f"{addr}:{port}"
print(parts.hostname, port, urlunsplit(parts._replace(netloc=netloc)))
PY
}

netns_destroy() {  # NAME: its processes, forwarders, namespace and veth, whatever is left of them
  local ns pids pidfile
  ns=$(ns_name "$1")
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns"; then
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  fi
  for pidfile in "$CLUSTER_DIR/pids/fwd-$1-"*.pid; do
    [ -f "$pidfile" ] || continue
    kill -KILL -- "-$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  ip link del "$(veth "$1" h)" 2>/dev/null || true
}

netns_teardown() {  # every namespace, veth and forwarder of this cluster, found by name and address
  command -v ip >/dev/null || return 0
  local ns link pid name
  for name in $(names); do [ "$name" = nginx ] || netns_destroy "$name"; done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^sagaplane-$CLUSTER_PORT-" || true); do
    netns_destroy "${ns#sagaplane-"$CLUSTER_PORT"-}"
  done
  # Forwarders whose pid files are gone (a removed $CLUSTER_DIR): listeners on this cluster's addresses.
  if command -v ss >/dev/null; then
    local pattern=" ${CLUSTER_NETNS_NET//./\.}\.[0-9]+:"
    for pid in $(ss -Hltnp 2>/dev/null | grep -E "$pattern" | grep -oE 'pid=[0-9]+' | cut -d= -f2 | sort -u); do
      # A forwarder leads its own process group, with a child per open connection: all of them.
      if [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ]; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
      kill -KILL "$pid" 2>/dev/null || true
    done
  fi
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^sp${CLUSTER_PORT}[hn][0-9]+$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
}

listening() {  # ADDR PORT
  ss -Hltn "src $1 and sport = :$2" 2>/dev/null | grep -q .
}

netns_ready() {  # NAME: namespace, veth and every forwarder in place
  local pidfile
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(ns_name "$1")" || return 1
  ip link show "$(veth "$1" h)" >/dev/null 2>&1 || return 1
  for pidfile in "$CLUSTER_DIR/pids/fwd-$1-"*.pid; do
    [ -f "$pidfile" ] && kill -0 -- "-$(cat "$pidfile")" 2>/dev/null || return 1
  done
}

netns_create() {  # NAME: a namespace joined by a veth pair, and a forwarder per service it uses
  local name=$1 ns host_end ns_end haddr service host port rewritten deadline
  ns=$(ns_name "$name"); host_end=$(veth "$name" h); ns_end=$(veth "$name" n); haddr=$(host_addr "$name")
  netns_destroy "$name"
  ip netns add "$ns"
  ip link add "$host_end" type veth peer name "$ns_end"
  ip link set "$ns_end" netns "$ns"
  ip addr add "$haddr/30" dev "$host_end"
  ip link set "$host_end" up
  ip netns exec "$ns" ip addr add "$(ns_addr "$name")/30" dev "$ns_end"
  ip netns exec "$ns" ip link set "$ns_end" up
  ip netns exec "$ns" ip link set lo up
  for service in DATABASE_URL REDIS_URL; do
    read -r host port rewritten < <(forwarded "$haddr" "${!service}")
    [ -n "$rewritten" ] || { echo "$service cannot be forwarded into $ns" >&2; return 1; }
    if [ ! -f "$CLUSTER_DIR/pids/fwd-$name-$port.pid" ]; then
      setsid socat "TCP-LISTEN:$port,bind=$haddr,reuseaddr,fork" "TCP:$host:$port" \
        >>"$CLUSTER_DIR/logs/fwd-$name.log" 2>&1 </dev/null &
      echo $! >"$CLUSTER_DIR/pids/fwd-$name-$port.pid"
      deadline=$(($(date +%s) + 10))
      until listening "$haddr" "$port"; do
        if [ "$(date +%s)" -ge "$deadline" ]; then echo "the forwarder on $haddr:$port did not start" >&2; return 1; fi
        sleep 0.1
      done
    fi
  done
}

in_netns() {  # NAME COMMAND...: as COMMAND, in NAME's namespace with the URLs of its forwarders
  local name=$1; shift
  local haddr; haddr=$(host_addr "$name")
  local database redis
  database=$(forwarded "$haddr" "$DATABASE_URL" | cut -d' ' -f3-)
  redis=$(forwarded "$haddr" "$REDIS_URL" | cut -d' ' -f3-)
  # Exported, never on a command line (where any user of the machine could read the passwords).
  export DATABASE_URL="$database" REDIS_URL="$redis"
  # The replica answers probes at its own address; nginx's requests arrive from the host end.
  export ALLOWED_HOSTS="$ALLOWED_HOSTS,$(ns_addr "$name")" FORWARDED_ALLOW_IPS="$haddr"
  launch "$name" ip netns exec "$(ns_name "$name")" "$@"
}

write_nginx_conf() {
  local upstreams=""
  # Two failures within 2 s take a replica out for 2 s: one lost connection alone does not, or a
  # healthy replica could be skipped beside a draining one and the balancer would have no one.
  for i in $(seq 1 "$WEB_REPLICAS"); do
    upstreams+="    server $(web_host "web-$i"):$(web_port "web-$i") max_fails=2 fail_timeout=2s;"$'\n'
  done
  local user=""
  # Started as root (a container, CI), nginx's workers would drop to an account that cannot
  # write this folder; they stay this script's user instead.
  if [ "$(id -u)" = 0 ]; then user="user root;"; fi
  cat >"$CLUSTER_DIR/nginx/nginx.conf" <<EOF
$user
worker_processes 1;
pid $CLUSTER_DIR/nginx/nginx.pid;
error_log $CLUSTER_DIR/logs/nginx-error.log warn;
daemon off;
events { worker_connections 1024; }
http {
  # The combined format, then which replica answered (the fault tests read both).
  log_format upstream '\$remote_addr - \$remote_user [\$time_local] "\$request" \$status \$body_bytes_sent '
                      '"\$http_referer" "\$http_user_agent" upstream="\$upstream_addr"';
  access_log $CLUSTER_DIR/logs/nginx-access.log upstream;
  client_body_temp_path $CLUSTER_DIR/nginx/body;
  proxy_temp_path $CLUSTER_DIR/nginx/proxy;
  fastcgi_temp_path $CLUSTER_DIR/nginx/fastcgi;
  uwsgi_temp_path $CLUSTER_DIR/nginx/uwsgi;
  scgi_temp_path $CLUSTER_DIR/nginx/scgi;
  client_max_body_size 16m;
  upstream sagaplane {
$upstreams    keepalive 32;
    # Shorter than the replicas' own keep-alive (75 s, infra/gunicorn.conf.py): nginx, not the
    # replica, closes an idle connection, so it never reuses one the replica is closing.
    keepalive_timeout 60s;
  }
  map \$http_upgrade \$connection_upgrade { default upgrade; '' ''; }
  server {
    listen 127.0.0.1:$CLUSTER_PORT;
    # A replica that is gone (connection refused, reset) or not ready (502/503) is skipped for
    # the next one; ingest is idempotent (a resent record is acknowledged as a duplicate), so a
    # batch whose replica died before answering is resent there too.
    proxy_next_upstream error timeout http_502 http_503 non_idempotent;
    proxy_next_upstream_tries $WEB_REPLICAS;
    proxy_connect_timeout 2s;
    proxy_read_timeout 120s;
    location = /metrics { return 404; }
    location / {
      proxy_pass http://sagaplane;
      proxy_http_version 1.1;
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Request-ID \$request_id;
      proxy_set_header Upgrade \$http_upgrade;
      proxy_set_header Connection \$connection_upgrade;
    }
  }
}
EOF
}

launch() {  # NAME COMMAND...: in its own session, its log and pid file
  local name=$1; shift
  setsid "$@" >>"$CLUSTER_DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$CLUSTER_DIR/pids/$name.pid"
}

run_as() {  # NAME COMMAND...: on the host, or in NAME's own namespace
  local name=$1; shift
  if netns_on; then
    netns_ready "$name" || netns_create "$name"
    (in_netns "$name" "$@")
  else
    launch "$name" "$@"
  fi
}

start_one() {
  local name=$1
  if alive "$name"; then echo "$name is already running"; return 0; fi
  case "$name" in
    web-*)
      # Each replica counts its own workers (a shared folder would report the others' counts).
      PROMETHEUS_MULTIPROC_DIR="$CLUSTER_DIR/metrics/$name" WEB_CONCURRENCY="$WEB_CONCURRENCY" \
        run_as "$name" "$BIN/gunicorn" -c infra/gunicorn.conf.py controlplane.asgi:application \
        --bind "$(web_host "$name"):$(web_port "$name")" --graceful-timeout 30 ;;
    worker-*)
      run_as "$name" "$BIN/celery" -A controlplane worker --concurrency=1 --hostname "$name@%h" \
        --loglevel=INFO ;;
    beat)
      run_as beat "$BIN/celery" -A controlplane beat --loglevel=INFO \
        --schedule="$CLUSTER_DIR/data/celerybeat-schedule" ;;
    nginx)
      write_nginx_conf
      launch nginx "$NGINX" -p "$CLUSTER_DIR/nginx" -c "$CLUSTER_DIR/nginx/nginx.conf" ;;
    *) echo "unknown process $name (web-N, worker-N, beat, nginx)" >&2; return 2 ;;
  esac
}

signal_one() {  # SIGNAL NAME: TERM/QUIT to the process, which stops its children itself;
  # KILL to its whole process group (as a killed container: master and workers at once).
  local pid; pid=$(pid_of "$2")
  [ -n "$pid" ] || return 0
  if [ "$1" = KILL ]; then kill -KILL -- "-$pid" 2>/dev/null || true; else kill "-$1" "$pid" 2>/dev/null || true; fi
}

wait_gone() {  # SECONDS NAME...
  local deadline=$(($(date +%s) + $1)); shift
  for name in "$@"; do
    while alive "$name" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
  done
}

ready() {  # URL: /readyz answers 200
  "$BIN/python" -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=3).status == 200 else 1)" "$1" 2>/dev/null
}

wait_ready() {  # URL SECONDS
  local deadline=$(($(date +%s) + $2))
  until ready "$1"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "$1 did not become ready within $2 s" >&2; return 1; fi
    sleep 0.3
  done
}

up() {
  environment
  if [ ! -x "$NGINX" ]; then echo "nginx is not installed (apt-get install nginx)" >&2; exit 1; fi
  if [ -n "${DATABASE_OWNER_URL:-}" ]; then
    "$BIN/python" manage.py migrate --noinput -v0
  fi
  "$BIN/python" manage.py collectstatic --noinput -v0
  case "${SAGAPLANE_CLUSTER_NETNS:-0}" in
    1|true|yes) netns_usable || exit 1; touch "$CLUSTER_DIR/netns" ;;
    *) rm -f "$CLUSTER_DIR/netns" ;;
  esac
  # The web processes, workers and beat run as the runtime role only (core/rls.py).
  (unset DATABASE_OWNER_URL; for name in $(names); do start_one "$name"; done)
  for i in $(seq 1 "$WEB_REPLICAS"); do wait_ready "$(web_url "web-$i")/readyz" 120; done
  wait_ready "http://127.0.0.1:$CLUSTER_PORT/readyz" 30
  local where=""
  if netns_on; then where=", each in its own network namespace"; fi
  echo "Sagaplane cluster is up at http://127.0.0.1:$CLUSTER_PORT/ ($WEB_REPLICAS web replicas, $CELERY_WORKERS workers, one beat$where)"
}

down() {
  local all; all=$(names)
  # Stop taking traffic first, then let replicas drain and workers finish their tasks.
  signal_one QUIT nginx
  for name in $all; do [ "$name" = nginx ] || signal_one TERM "$name"; done
  # shellcheck disable=SC2086
  wait_gone 60 $all
  for name in $all; do
    if alive "$name"; then echo "$name did not stop in time: SIGKILL" >&2; signal_one KILL "$name"; fi
    rm -f "$CLUSTER_DIR/pids/$name.pid"
  done
  # Namespaces, veths and forwarders: also those a crash or a SIGKILL left behind.
  netns_teardown
  rm -f "$CLUSTER_DIR/netns"
  echo "Sagaplane cluster is down"
}

status() {
  local failing=0
  for name in $(names); do
    if alive "$name"; then state="running (pid $(pid_of "$name"))"; else state="stopped"; failing=1; fi
    case "$name" in
      web-*) if ready "$(web_url "$name")/readyz"; then state+=", ready"; else state+=", not ready"; failing=1; fi ;;
      nginx) if ready "http://127.0.0.1:$CLUSTER_PORT/readyz"; then state+=", /readyz 200"; else state+=", /readyz failing"; failing=1; fi ;;
    esac
    if netns_on && [ "$name" != nginx ]; then state+=", netns $(ns_name "$name") $(ns_addr "$name")"; fi
    printf '%-10s %s\n' "$name" "$state"
  done
  return $failing
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  start) environment; (unset DATABASE_OWNER_URL; start_one "$2") ;;
  stop) signal_one TERM "$2"; wait_gone 60 "$2"; if alive "$2"; then signal_one KILL "$2"; fi ;;
  kill) signal_one KILL "$2"; wait_gone 10 "$2" ;;
  url) web_url "$2" ;;
  restart) signal_one TERM "$2"; wait_gone 60 "$2"; environment; (unset DATABASE_OWNER_URL; start_one "$2") ;;
  *) echo "usage: infra/cluster.sh up|down|status|start NAME|stop NAME|kill NAME|restart NAME|url web-N" >&2; exit 2 ;;
esac
