#!/usr/bin/env bash
# Every benchmark in bench/ (each prints ratios against a peer measured in the same run and writes
# bench/results/<name>.json). `--quick` is what CI runs: small counts, to keep them working.
set -euo pipefail
cd "$(dirname "$0")/.."
# The same Postgres / Redis discovery as `make test`: DATABASE_URL / REDIS_URL set when reachable.
source infra/services.sh
if [ -n "${DATABASE_URL:-}" ]; then echo "== services: Postgres${REDIS_URL:+ and Redis}"; else echo "== services: embedded SQLite"; fi
status=0
for script in bench/*.py; do
  echo "== $script $*"
  .venv/bin/python "$script" "$@" || status=1
done
exit $status
