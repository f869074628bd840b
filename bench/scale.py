"""Scale benchmark (issue 15): what ingest, proofs, the saga list and exports cost as one tenant
grows, and with a thousand tenants beside it.

Phase 1 grows one tenant through the real ingest service (in-process, batches of 1,000 chained
records over 10 agent streams, shaped as sagas: start, four steps, complete; one saga in 1,000
uses a rare tool), integrating (and signing) every 100 batches, to each rung of a ladder (full:
100,000 / 1,000,000 / 10,000,000 records; `--quick`: 2,000 / 6,000). It records the ingest rate
at points along the way (records/s of the median of the 100 batches before each point, and
their mean: the cost curve)
and at each rung measures:
- inclusion and consistency proof latency through the API (p50/p99, Django's test client: the
  whole request path minus the socket);
- the saga list through the API (p95): unfiltered, by status, by a common and a rare tool, since
  a moment, tool + status, and pages 2-21 by cursor; with the Postgres plan (EXPLAIN ANALYZE as
  the runtime role, under row-level security) of the tool filters;
- the dashboard's saga list page (p95, the whole page: capped status counts, filter choices,
  rows): unfiltered, by status, by tool, since, and Older pages 2-11;
- a WORM export of the newest 100,000 leaves: build and offline verify rates;
- table + index bytes per million records; load averages before and after.
Phase 2 (`--tenants N`) adds N tenants of `--per-tenant` records each (full: 1,000 x 10,000),
recording ingest rate per block of tenants and proofs / list of a sample tenant and of the big
one at the end.

The peer: at each point of the curve a fresh tenant is fed one batch after each of the big
tenant's last 100, so both rates are taken under the same load; `ratio_to_peer` is the big
tenant's rate over the fresh one's (issue 15's target: 10M within 20% of 100k, a ratio >= 0.8).
Each point's ratio to the first point is reported too, but on a shared machine the load moves
it more than the size does. Targets also: proofs p99 < 5 ms and saga list p95 < 100 ms.
Reported, never asserted.

By default it runs on a Postgres server of its own, configured as production is (shared_buffers a
quarter of the memory, autovacuum on; bench/support/pgserver.py), kept in `<data-dir>/postgres`:
the machine's shared Postgres is a development server (128 MiB of shared_buffers, autovacuum off
here) that ten million records would fill with 16 GB. `--server shared` uses DATABASE_URL's
server instead; without it a throw-away SQLite file (sizes then omitted). On Postgres it works in
its own database `<name>_bench_scale`. `--quick` creates it
fresh and drops it after. The full run is incremental: it keeps the database (and its data dir,
`--data-dir`) and, run again, continues growing it from where it stopped, merging into
bench/results/scale.json, which it rewrites after every measurement; `--drop` drops it at the end.

    .venv/bin/python bench/scale.py --quick
    .venv/bin/python bench/scale.py [--sizes 100000,1000000,10000000] [--tenants 1000] [--drop]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tenants.actors import system_actor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sdk"))

from bench.support.scale_database import (  # noqa: E402
    ANALYZED,
    analyze_sagas,
    autovacuum_stand_in,
    blocks_per_1000,
    drop_database,
    index_blocks,
    own_database,
    table_sizes,
    tool_plans,
)
from bench.support.scale_measures import (  # noqa: E402
    api_listing,
    load_averages,
    measure,
    page_listing,
    proof_latencies,
)

BATCH = 1000
STREAMS = 10
INTEGRATE_EVERY = 100  # batches
RATE_WINDOW = 100  # batches: the ingest rate at a point is over the 100 batches before it
RARE_EVERY = 1000  # one saga in 1,000 uses tool.rare
TARGET_INGEST_RATIO = 0.8
TARGET_PROOF_P99_MS = 5.0
TARGET_LIST_P95_MS = 100.0


def _setup(data_dir: str, database: tuple[str, str, str] | None, *, migrate: bool = True) -> None:
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
    if not migrate:
        return
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Grower:
    """Ten agent streams, each a chain, fed batches of saga-shaped records through ingest. It picks
    up where the tenant's streams stand, so a run continues a database an earlier run grew."""

    def __init__(self, tenant: Any) -> None:
        from sagaplane.chain import GENESIS

        from audit.models import Stream
        from core.scoping import tenant_context

        self.tenant = tenant
        self.heads = [GENESIS] * STREAMS
        self.seqs = [0] * STREAMS
        with tenant_context(tenant):
            for stream_id, head, seq in Stream.objects.filter(stream_id__startswith="agent-").values_list(
                "stream_id", "head_hash", "head_seq"
            ):
                n = int(stream_id.split("-")[1])
                self.heads[n], self.seqs[n] = head, seq or 0
        self.total = sum(self.seqs)
        self.turn = self.total // BATCH
        self.since_integrate = 0
        self.integrate_s = 0.0
        self.integrated = 0  # leaves, approximately (the server stream's few are not counted)

    def batch(self) -> tuple[str, list[dict[str, Any]]]:
        from sagaplane.chain import stamp

        n = self.turn % STREAMS
        self.turn += 1
        records = []
        for _ in range(BATCH):
            self.seqs[n] += 1
            seq = self.seqs[n]
            phase, number = (seq - 1) % 6, (seq - 1) // 6
            saga = f"a{n}-{number}"
            event = "SAGA_START" if phase == 0 else "SAGA_COMPLETE" if phase == 5 else "STEP_COMMITTED"
            tool = "tool.rare" if phase == 4 and number % RARE_EVERY == 0 else f"tool.{phase % 3}"
            record = {
                "seq": seq,
                "ts": 1_700_000_000.0 + seq,
                "event": event,
                "saga_id": saga,
                "step_id": f"{saga}-{phase}",
                "tool": tool,
            }
            self.heads[n] = stamp(record, self.heads[n])
            records.append(record)
        return f"agent-{n}", records

    def step(self) -> float:
        """One batch through ingest (integrating every INTEGRATE_EVERY batches, not timed);
        the seconds ingest took."""
        from audit import services
        from core.scoping import tenant_context

        stream, records = self.batch()
        start = time.perf_counter()
        with tenant_context(self.tenant):  # as the ingest view enters it
            services.ingest(self.tenant, stream, records, actor=system_actor("bench"))
        took = time.perf_counter() - start
        self.total += len(records)
        self.since_integrate += 1
        if self.since_integrate >= INTEGRATE_EVERY:
            self.integrate()
        return took

    def integrate(self) -> float:
        from transparency.tasks import integrate_fully

        start = time.perf_counter()
        integrate_fully(self.tenant)
        took = time.perf_counter() - start
        self.integrate_s += took
        self.integrated += self.since_integrate * BATCH
        self.since_integrate = 0
        autovacuum_stand_in()  # not timed: autovacuum's work is the server's, beside ingest
        return took


class Report:
    """bench/results/scale(-quick).json, rewritten after every measurement (a run that stops
    leaves what it measured); a continued run merges into what an earlier one wrote."""

    def __init__(self, path: Path, keep: bool, quick: bool) -> None:
        self.path = path
        old = json.loads(path.read_text()) if keep and path.exists() else {}
        self.data: dict[str, Any] = {
            "benchmark": "scale",
            "quick": quick,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "batch": BATCH,
            "streams": STREAMS,
            "curve": old.get("curve", []),
            "rungs": old.get("rungs", []),
            "tenants": old.get("tenants", {}),
            "runs": old.get("runs", []),
        }

    def point(
        self, records: int, rate: float, mean: float, integrate_leaves_per_s: float | None, peer: float | None
    ) -> None:
        self.data["curve"] = [p for p in self.data["curve"] if p["records"] != records]
        self.data["curve"].append(
            {
                "records": records,
                "ingest_records_per_s": rate,
                "ingest_records_per_s_mean": mean,
                # a fresh tenant's first 100 batches, interleaved with these: same load
                "peer_ingest_records_per_s": peer,
                "ratio_to_peer": round(rate / peer, 3) if peer else None,
                "integrate_leaves_per_s": integrate_leaves_per_s,
                "load_average": load_averages(),
                "at": time.strftime("%H:%M:%S", time.gmtime()),
            }
        )
        print(json.dumps(self.data["curve"][-1]), flush=True)
        self.write()

    def has_rung(self, records: int) -> bool:
        return any(r["records"] == records for r in self.data["rungs"])

    def rung(self, result: dict[str, Any]) -> None:
        self.data["rungs"] = [r for r in self.data["rungs"] if r["records"] != result["records"]] + [result]
        self.write()

    def write(self) -> None:
        curve = sorted(self.data["curve"], key=lambda p: p["records"])
        self.data["curve"] = curve
        rungs = sorted(self.data["rungs"], key=lambda r: r["records"])
        self.data["rungs"] = rungs
        first = curve[0]["ingest_records_per_s"] if curve else None
        for p in curve:
            p["ingest_ratio_to_first"] = round(p["ingest_records_per_s"] / first, 3) if first else None
        if rungs:
            last = rungs[-1]
            self.data["targets"] = {
                "ingest_ratio_last_to_first": {
                    "want": f">= {TARGET_INGEST_RATIO}",
                    "got": curve[-1]["ingest_ratio_to_first"] if curve else None,
                    "at_records": curve[-1]["records"] if curve else None,
                },
                # the same question under the same load: the big tenant's rate over a fresh
                # tenant's, their batches interleaved
                "ingest_ratio_last_to_peer": {
                    "want": f">= {TARGET_INGEST_RATIO}",
                    "got": curve[-1].get("ratio_to_peer") if curve else None,
                    "at_records": curve[-1]["records"] if curve else None,
                },
                "proof_p99_ms": {
                    "want": f"< {TARGET_PROOF_P99_MS}",
                    "got": max(last["inclusion_ms"]["p99"], last["consistency_ms"]["p99"]),
                },
                "saga_list_p95_ms": {
                    "want": f"< {TARGET_LIST_P95_MS}",
                    "got": max(last["saga_list_p95_ms"].values()),
                },
            }
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")


def _client_for(tenant: Any) -> Any:
    from rest_framework.test import APIClient

    from core.scoping import tenant_context
    from tenants import services as tenant_services

    with tenant_context(tenant):  # tenants' services assert the scope, as a command enters it
        _, raw = tenant_services.create_api_key(
            tenant,
            tenant_services.NewApiKey(name="bench", scopes=["ingest", "read"]),
            actor=system_actor("bench"),
        )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _tenant(slug: str) -> Any:
    from tenants import founding
    from tenants.models import Tenant

    found = Tenant.objects.filter(slug=slug).first()
    return found or founding.create_tenant(
        slug, slug.title(), f"owner@{slug}.example", actor=system_actor("bench")
    )


def grow(
    grower: Grower,
    sizes: list[int],
    points: list[int],
    report: Report,
    client: Any,
    queries: int,
    tmp: str,
    goal: int,
) -> None:
    """Grow to each size; the ingest rate at each of `points` (and each size); measure at each size."""
    marks = sorted({*sizes, *points})
    window: list[float] = []
    for mark in marks:
        integrated = (grower.integrate_s, grower.integrated)
        grew = grower.total < mark
        # The peer: a fresh tenant fed a batch after each of the big tenant's last RATE_WINDOW
        # batches before the mark, so both rates are taken under the same load (the machine is
        # shared, and its load moves the absolute rates more than the size does).
        peer: Grower | None = None
        peer_window: list[float] = []
        blocks: dict[str, tuple[int, int]] = {}
        blocks_from = 0
        while grower.total < mark:
            window = (window + [grower.step()])[-RATE_WINDOW:]
            if mark - grower.total < RATE_WINDOW * BATCH:
                if peer is None:
                    peer = Grower(_tenant(f"peer{mark}"))
                    window = window[-1:]
                    blocks, blocks_from = index_blocks(), grower.total + peer.total
                peer_window.append(peer.step())
        if grew:
            seconds, leaves = grower.integrate_s - integrated[0], grower.integrated - integrated[1]
            # The median batch: one batch slowed by a neighbour (or a checkpoint) does not move it.
            rate = round(BATCH / sorted(window)[len(window) // 2], 1)
            mean = round(len(window) * BATCH / sum(window), 1)
            peer_rate = round(BATCH / sorted(peer_window)[len(peer_window) // 2], 1) if peer_window else None
            report.data["autovacuum"] = {
                **ANALYZED,
                "stand_in": "with the server's autovacuum off, the growing tables are analyzed at "
                "autovacuum's own thresholds every 100 batches (autovacuum_stand_in)",
            }
            report.point(grower.total, rate, mean, round(leaves / seconds) if seconds else None, peer_rate)
            if peer is not None and blocks:
                report.data["curve"][-1]["index_blocks_read_per_1000_records"] = blocks_per_1000(
                    blocks, grower.total + peer.total - blocks_from
                )
                report.write()
        if disk_guard(grower.total, goal):
            report.data["stopped"] = f"disk: stopped at {grower.total:,} records, see sizes"
            report.write()
            raise SystemExit(2)
        if mark in sizes and grower.total == mark and not report.has_rung(mark):
            try:
                report.rung(measure(grower, client, queries, tmp))
            except Exception as error:  # a long run keeps growing; the report says what failed
                report.data.setdefault("errors", []).append(f"rung {mark}: {error!r}"[:2000])
                report.write()
                print(f"rung {mark} failed: {error!r}", flush=True)


def disk_guard(records: int, goal: int) -> bool:
    """True when growing to `goal` records in all at this database's bytes per record would
    leave < 15 GiB free."""
    from django.db import connection

    if connection.vendor != "postgresql" or records < 500_000:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        used = cursor.fetchone()[0]
    need = used / records * (goal - records)
    return shutil.disk_usage("/").free - need < 15 * 2**30


def tenants_phase(count: int, per: int, report: Report, queries: int, big: Grower, big_client: Any) -> None:
    """`count` tenants of `per` records each, resumable: the ingest rate per block of 100 tenants;
    at 100, 250, 500, 750 and `count` tenants, proofs and the saga list of the newest tenant and
    of the big one beside them."""
    block_start, block_records = time.perf_counter(), 0
    blocks = report.data["tenants"].setdefault("blocks", [])
    samples = report.data["tenants"].setdefault("samples", [])
    report.data["tenants"].update({"goal": count, "records_each": per})
    for i in range(1, count + 1):
        tenant = _tenant(f"mt{i:04d}")
        grower = Grower(tenant)
        while grower.total < per:
            grower.step()
            block_records += BATCH
        if grower.since_integrate:
            grower.integrate()
        if (i % 100 == 0 or i == count) and block_records:
            blocks.append(
                {
                    "tenants": i,
                    "records_per_s_incl_tenant_setup_and_integration": round(
                        block_records / (time.perf_counter() - block_start), 1
                    ),
                    "load_average": load_averages(),
                    "at": time.strftime("%H:%M:%S", time.gmtime()),
                }
            )
            print(json.dumps(blocks[-1]), flush=True)
            report.write()
        if (i in (100, 250, 500, 750) or i == count) and not any(x["tenants"] == i for x in samples):
            try:
                analyze_sagas()
                client = _client_for(tenant)
                samples.append(
                    {
                        "tenants": i,
                        "newest_tenant": {
                            **proof_latencies(client, tenant, queries),
                            "saga_list_p95_ms": api_listing(client, tenant, queries),
                        },
                        "big_tenant_beside_them": {
                            "records": big.total,
                            **proof_latencies(big_client, big.tenant, queries),
                            "saga_list_p95_ms": api_listing(big_client, big.tenant, queries),
                        },
                        "sizes": table_sizes(big.total + i * per),
                        "load_average": load_averages(),
                        "at": time.strftime("%H:%M:%S", time.gmtime()),
                    }
                )
                print(json.dumps(samples[-1]), flush=True)
            except Exception as error:  # keep growing; the report says what failed
                report.data.setdefault("errors", []).append(f"tenants {i}: {error!r}"[:2000])
            report.write()
        if i % 100 == 0:
            block_start, block_records = time.perf_counter(), 0
    report.data["tenants"]["count"] = count


def list_only(data_dir: str, queries: int) -> int:
    """Proofs and the saga list through the API on the database a full run grew (nothing grown,
    nothing dropped): for checking a change against the big tenant without a new run, or
    measuring it again on a quiet machine."""
    database = own_database(fresh=False)
    # No migrate: it re-applies the row-level security policies, which waits for a running
    # growth's transactions, and the grown schema is what is being measured.
    _setup(data_dir, database, migrate=False)
    tenant = _tenant("scale")
    grower = Grower(tenant)
    analyze_sagas()
    client = _client_for(tenant)
    out = {
        "benchmark": "scale-list",
        "records": grower.total,
        "database_gib": (table_sizes(grower.total) or {}).get("database_gib"),
        "proofs": proof_latencies(client, tenant, queries),
        "saga_list_p95_ms": api_listing(client, tenant, queries),
        "saga_list_page_p95_ms": page_listing(tenant, queries),
        "plans": tool_plans(tenant),
        "load_average": load_averages(),
        "at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    path = ROOT / "bench" / "results" / "scale-list.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["saga_list_p95_ms"]))
    return 0


def _close_connections() -> None:
    """Every session of this process, the runtime role's pooled ones too (before a DROP or a stop)."""
    from django.db import connections

    for connection in connections.all():
        if hasattr(connection, "close_pool"):
            connection.close_pool()
    connections.close_all()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    parser.add_argument("--sizes", help="comma-separated record counts (default 100000,1000000,10000000)")
    parser.add_argument("--points", help="extra record counts for the ingest-rate curve only")
    parser.add_argument("--tenants", type=int, help="phase 2: this many tenants (full default 1000)")
    parser.add_argument("--per-tenant", type=int, default=10_000)
    parser.add_argument("--data-dir", default="/tmp/sagaplane-bench-scale", help="kept between full runs")
    parser.add_argument("--drop", action="store_true", help="drop the database when done")
    parser.add_argument(
        "--server",
        choices=["private", "shared"],
        default="private" if shutil.which("pg_config") else "shared",
        help="private (default where Postgres' server binaries are installed): a Postgres of the "
        "benchmark's own with production settings (bench/support/pgserver.py), in <data-dir>/postgres; "
        "shared: DATABASE_URL's server",
    )
    parser.add_argument(
        "--list-only",
        action="store_true",
        help="measure proofs and the saga list of the grown tenant only, nothing grown "
        "(bench/results/scale-list.json)",
    )
    args = parser.parse_args()
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([2_000, 6_000] if args.quick else [100_000, 1_000_000, 10_000_000])
    )
    points = (
        [int(s) for s in args.points.split(",")]
        if args.points
        else ([] if args.quick else [300_000, 2_000_000, 3_000_000, 5_000_000, 7_000_000])
    )
    tenants = args.tenants if args.tenants is not None else (3 if args.quick else 1000)
    per = 1000 if args.quick else args.per_tenant
    queries = 10 if args.quick else 200
    server = None
    if args.server == "private":
        from bench.support.pgserver import private_server

        folder = (
            Path(args.data_dir) / "postgres" if not args.quick else Path(tempfile.mkdtemp(prefix="sp-pg-"))
        )
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o755, exist_ok=True)
        folder.chmod(0o755)
        server = private_server(folder)
        server.start()
        os.environ.update(server.environment())
        report_server: dict[str, Any] = {"private": True, "settings": server.settings}
    else:
        report_server = {"private": False, "url": os.environ.get("DATABASE_URL", "").split("@")[-1]}
    if args.list_only:
        try:
            return list_only(args.data_dir, queries)
        finally:
            _close_connections()
            if server is not None:
                server.stop()
    database = own_database(fresh=args.quick)
    name = "scale-quick.json" if args.quick else "scale.json"
    report = Report(ROOT / "bench" / "results" / name, keep=not args.quick, quick=args.quick)
    report.data["runs"].append(
        {
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "load_average": load_averages(),
            "postgres": report_server,
        }
    )
    with tempfile.TemporaryDirectory(prefix="sagaplane-bench-scale-") as tmp:
        data_dir = tmp if args.quick else args.data_dir
        os.makedirs(data_dir, exist_ok=True)
        try:
            _setup(data_dir, database)
            tenant = _tenant("scale")
            client = _client_for(tenant)
            grower = Grower(tenant)
            grow(grower, sizes, points, report, client, queries, tmp, max(sizes) + tenants * per)
            if tenants:
                tenants_phase(tenants, per, report, queries, grower, client)
        finally:
            _close_connections()
            if database and (args.quick or args.drop):
                drop_database(database[1], database[2])
            if server is not None:
                server.stop()
                if args.quick or args.drop:
                    shutil.rmtree(server.folder, ignore_errors=True)
    report.data["runs"][-1]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    report.write()
    print(f"wrote {report.path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
