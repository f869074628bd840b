"""Scale benchmark (issue 15): what ingest, proofs and the saga list cost as one tenant grows.

One tenant is grown through the real ingest service (in-process, batches of 1,000 chained records
over 10 agent streams, shaped as sagas: start, four steps, complete) to each size of a ladder
(full: 100,000 / 1,000,000 / 10,000,000 records; `--quick`: 2,000 / 6,000; `--sizes` to choose),
integrated and signed at each rung, and at each rung measures:
- ingest records/s over the rung's last 10% of batches (the cost at that size);
- inclusion and consistency proof latency through the API (p50/p99, Django's test client: the
  whole request path, minus the socket);
- the saga list through the API (p95), unfiltered, by status, and by tool;
- on Postgres, table + index bytes per million records of the record, payload, tree, saga and
  step tables.
The peer is the same code at the first rung: the report gives each rung's ingest rate as a ratio
of the first one (issue 15's target: 10M within 20% of 100k, i.e. a ratio >= 0.8), and the
targets proofs p99 < 5 ms and saga list p95 < 100 ms. Reported, never asserted.

Not measured here yet: the 1,000-tenant x 10,000-record population and export build/verify rates
at scale (bench/transparency.py measures export verification at 1M leaves).

Needs nothing: without DATABASE_URL it runs on a throw-away SQLite file (sizes then omitted). With
DATABASE_URL and DATABASE_OWNER_URL (infra/services.sh sets them) it works in its own database
`<name>_bench_scale`, created and migrated by the owner role and dropped afterwards.
Results: bench/results/scale.json (`--quick`: scale-quick.json).

    .venv/bin/python bench/scale.py [--quick] [--sizes 100000,1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sdk"))

BATCH = 1000
STREAMS = 10
TARGET_INGEST_RATIO = 0.8
TARGET_PROOF_P99_MS = 5.0
TARGET_LIST_P95_MS = 100.0
TABLES = ["audit_record", "audit_recordpayload", "transparency_treenode", "sagas_saga", "sagas_step"]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


def _own_database() -> tuple[str, str, str] | None:
    """(runtime URL, owner URL, name) of `<name>_bench_scale`, created fresh by the owner role."""
    url, owner = os.environ.get("DATABASE_URL", ""), os.environ.get("DATABASE_OWNER_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not owner:
        return None
    import psycopg

    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_scale"

    def beside(base: str, path: str) -> str:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(path=path))

    with psycopg.connect(
        beside(owner, "/postgres").replace("postgres://", "postgresql://", 1), autocommit=True
    ) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    return beside(url, f"/{name}"), beside(owner, f"/{name}"), name


def _drop(owner_url: str, name: str) -> None:
    import psycopg

    admin = urllib.parse.urlunsplit(urllib.parse.urlsplit(owner_url)._replace(path="/postgres"))
    with psycopg.connect(admin.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _setup(data_dir: str, database: tuple[str, str, str] | None) -> None:
    os.environ["SAGAPLANE_DATA_DIR"] = data_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    os.environ["LOG_LEVEL"] = "WARNING"
    for var in ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL"):
        os.environ.pop(var, None)
    if database:
        os.environ["DATABASE_URL"], os.environ["DATABASE_OWNER_URL"] = database[0], database[1]
    os.environ["SAGAPLANE_GATE_STORE"] = "database"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Grower:
    """Ten agent streams, each a chain, fed batches of saga-shaped records through ingest."""

    def __init__(self, tenant: Any) -> None:
        from sagaplane.chain import GENESIS

        self.tenant = tenant
        self.heads = [GENESIS] * STREAMS
        self.seqs = [0] * STREAMS
        self.total = 0
        self.turn = 0

    def batch(self) -> tuple[str, list[dict[str, Any]]]:
        from sagaplane.chain import stamp

        n = self.turn % STREAMS
        self.turn += 1
        records = []
        for _ in range(BATCH):
            self.seqs[n] += 1
            seq = self.seqs[n]
            phase, saga = (seq - 1) % 6, f"a{n}-{(seq - 1) // 6}"
            event = "SAGA_START" if phase == 0 else "SAGA_COMPLETE" if phase == 5 else "STEP_COMMITTED"
            record = {
                "seq": seq,
                "ts": 1_700_000_000.0 + seq,
                "event": event,
                "saga_id": saga,
                "step_id": f"{saga}-{phase}",
                "tool": f"tool.{phase % 3}",
            }
            self.heads[n] = stamp(record, self.heads[n])
            records.append(record)
        return f"agent-{n}", records

    def grow_to(self, size: int) -> float:
        """Ingest until `size` records; records/s over the last 10% of the batches."""
        from audit import services

        batches = max(1, (size - self.total) // BATCH)
        tail_from = batches - max(1, batches // 10)
        tail_start, tail_records = 0.0, 0
        for i in range(batches):
            stream, records = self.batch()
            if i == tail_from:
                tail_start = time.perf_counter()
            services.ingest(self.tenant, stream, records, actor="bench")
            if i >= tail_from:
                tail_records += len(records)
            self.total += len(records)
        return round(tail_records / (time.perf_counter() - tail_start), 1)


def _api(client: Any, path: str, params: dict[str, Any], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        response = client.get(path, params)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, (path, response.status_code, response.content[:300])
    return samples


def _sizes_per_million(records: int) -> dict[str, float] | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    out = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            out[table] = round(cursor.fetchone()[0] / (records / 1_000_000) / 2**20, 1)  # MiB per million
    return out


def rung(grower: Grower, size: int, client: Any, queries: int) -> dict[str, Any]:
    from django.db import connection

    from transparency import services as transparency

    rate = grower.grow_to(size)
    start = time.perf_counter()
    transparency.integrate_fully(grower.tenant)
    integrate_s = time.perf_counter() - start
    from tenants.scoping import tenant_context
    from transparency.models import Checkpoint

    with tenant_context(grower.tenant):
        signed = Checkpoint.objects.order_by("-size").values_list("size", flat=True).first() or 0
    leaves = [random.randrange(signed) for _ in range(queries)]
    inclusion = []
    for leaf in leaves:
        inclusion += _api(client, "/api/v1/audit/proofs/inclusion", {"index": leaf}, 1)
    consistency = []
    for leaf in leaves:
        consistency += _api(client, "/api/v1/audit/proofs/consistency", {"first": max(1, leaf)}, 1)
    listing = {
        "all": _api(client, "/api/v1/sagas", {}, queries),
        "status=completed": _api(client, "/api/v1/sagas", {"status": "completed"}, queries),
        "tool=tool.1": _api(client, "/api/v1/sagas", {"tool": "tool.1"}, queries),
    }
    result = {
        "records": grower.total,
        "ingest_records_per_s": rate,
        "integrate_s": round(integrate_s, 2),
        "inclusion_ms": {"p50": _pct(inclusion, 0.5), "p99": _pct(inclusion, 0.99)},
        "consistency_ms": {"p50": _pct(consistency, 0.5), "p99": _pct(consistency, 0.99)},
        "saga_list_p95_ms": {name: _pct(samples, 0.95) for name, samples in listing.items()},
        "mib_per_million_records": _sizes_per_million(grower.total),
        "database": connection.vendor,
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    parser.add_argument("--sizes", help="comma-separated record counts (default 100000,1000000,10000000)")
    args = parser.parse_args()
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([2_000, 6_000] if args.quick else [100_000, 1_000_000, 10_000_000])
    )
    queries = 10 if args.quick else 200
    database = _own_database()
    with tempfile.TemporaryDirectory(prefix="sagaplane-bench-scale-") as data_dir:
        try:
            _setup(data_dir, database)
            from rest_framework.test import APIClient

            from tenants import services as tenant_services

            tenant = tenant_services.create_tenant("scale", "Scale", "owner@scale.example", actor="bench")
            _, raw = tenant_services.create_api_key(
                tenant, name="bench", scopes=["ingest", "read"], actor="bench"
            )
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
            grower = Grower(tenant)
            rungs = [rung(grower, size, client, queries) for size in sizes]
        finally:
            if database:
                from django.db import connections

                for connection in connections.all():
                    if hasattr(connection, "close_pool"):
                        connection.close_pool()  # the runtime role's pooled sessions
                connections.close_all()
                _drop(database[1], database[2])
    first = rungs[0]["ingest_records_per_s"]
    for r in rungs:
        r["ingest_ratio_to_first"] = round(r["ingest_records_per_s"] / first, 3)
    last = rungs[-1]
    report = {
        "benchmark": "scale",
        "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "batch": BATCH,
        "streams": STREAMS,
        "rungs": rungs,
        "targets": {
            "ingest_ratio_last_to_first": {
                "want": f">= {TARGET_INGEST_RATIO}",
                "got": last["ingest_ratio_to_first"],
            },
            "proof_p99_ms": {
                "want": f"< {TARGET_PROOF_P99_MS}",
                "got": max(last["inclusion_ms"]["p99"], last["consistency_ms"]["p99"]),
            },
            "saga_list_p95_ms": {
                "want": f"< {TARGET_LIST_P95_MS}",
                "got": max(last["saga_list_p95_ms"].values()),
            },
        },
    }
    name = "scale-quick.json" if args.quick else "scale.json"
    out = ROOT / "bench" / "results" / name
    out.write_text(json.dumps(report, indent=2) + "\n")
    ratio, first_size = last["ingest_ratio_to_first"], rungs[0]["records"]
    print(f"ingest at {last['records']:,} records: {ratio}x the rate at {first_size:,}")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
