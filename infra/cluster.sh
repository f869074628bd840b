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

write_nginx_conf() {
  local upstreams=""
  for i in $(seq 1 "$WEB_REPLICAS"); do
    upstreams+="    server 127.0.0.1:$(web_port "web-$i") max_fails=1 fail_timeout=2s;"$'\n'
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
  access_log $CLUSTER_DIR/logs/nginx-access.log;
  client_body_temp_path $CLUSTER_DIR/nginx/body;
  proxy_temp_path $CLUSTER_DIR/nginx/proxy;
  fastcgi_temp_path $CLUSTER_DIR/nginx/fastcgi;
  uwsgi_temp_path $CLUSTER_DIR/nginx/uwsgi;
  scgi_temp_path $CLUSTER_DIR/nginx/scgi;
  client_max_body_size 16m;
  upstream sagaplane {
$upstreams    keepalive 32;
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

start_one() {
  local name=$1
  if alive "$name"; then echo "$name is already running"; return 0; fi
  case "$name" in
    web-*)
      # Each replica counts its own workers (a shared folder would report the others' counts).
      PROMETHEUS_MULTIPROC_DIR="$CLUSTER_DIR/metrics/$name" WEB_CONCURRENCY="$WEB_CONCURRENCY" \
        launch "$name" "$BIN/gunicorn" -c infra/gunicorn.conf.py controlplane.asgi:application \
        --bind "127.0.0.1:$(web_port "$name")" --graceful-timeout 30 ;;
    worker-*)
      launch "$name" "$BIN/celery" -A controlplane worker --concurrency=1 --hostname "$name@%h" \
        --loglevel=INFO ;;
    beat)
      launch beat "$BIN/celery" -A controlplane beat --loglevel=INFO \
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
  # The web processes, workers and beat run as the runtime role only (tenants/rls.py).
  (unset DATABASE_OWNER_URL; for name in $(names); do start_one "$name"; done)
  for i in $(seq 1 "$WEB_REPLICAS"); do wait_ready "http://127.0.0.1:$(web_port "web-$i")/readyz" 120; done
  wait_ready "http://127.0.0.1:$CLUSTER_PORT/readyz" 30
  echo "Sagaplane cluster is up at http://127.0.0.1:$CLUSTER_PORT/ ($WEB_REPLICAS web replicas, $CELERY_WORKERS workers, one beat)"
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
  echo "Sagaplane cluster is down"
}

status() {
  local failing=0
  for name in $(names); do
    if alive "$name"; then state="running (pid $(pid_of "$name"))"; else state="stopped"; failing=1; fi
    case "$name" in
      web-*) if ready "http://127.0.0.1:$(web_port "$name")/readyz"; then state+=", ready"; else state+=", not ready"; failing=1; fi ;;
      nginx) if ready "http://127.0.0.1:$CLUSTER_PORT/readyz"; then state+=", /readyz 200"; else state+=", /readyz failing"; failing=1; fi ;;
    esac
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
  restart) signal_one TERM "$2"; wait_gone 60 "$2"; environment; (unset DATABASE_OWNER_URL; start_one "$2") ;;
  *) echo "usage: infra/cluster.sh up|down|status|start NAME|stop NAME|kill NAME|restart NAME" >&2; exit 2 ;;
esac
