#!/usr/bin/env bash
# Every benchmark in bench/ (each prints ratios against a peer measured in the same run and writes
# bench/results/<name>.json). `--quick` is what CI runs: small counts, to keep them working; quick
# runs write bench/results/<name>-quick.json (gitignored), never the committed full results.
# bench/sdk.py and bench/gate.py work in a database of their own beside DATABASE_URL's
# (`<name>_bench_sdk`, `<name>_bench_gate`, made by the owner role); gate.py starts its own redis-server.
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
