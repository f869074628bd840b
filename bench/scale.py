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
import contextlib
import json
import os
import platform
import random
import shutil
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
INTEGRATE_EVERY = 100  # batches
RATE_WINDOW = 100  # batches: the ingest rate at a point is over the 100 batches before it
EXPORT_WINDOW = 100_000
RARE_EVERY = 1000  # one saga in 1,000 uses tool.rare
TARGET_INGEST_RATIO = 0.8
TARGET_PROOF_P99_MS = 5.0
TARGET_LIST_P95_MS = 100.0
TABLES = ["audit_record", "audit_recordpayload", "transparency_treenode", "sagas_saga", "sagas_step"]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _beside(base: str, path: str) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(path=path))


def _admin(owner: str) -> str:
    return _beside(owner, "/postgres").replace("postgres://", "postgresql://", 1)


def _own_database(fresh: bool) -> tuple[str, str, str] | None:
    """(runtime URL, owner URL, name) of `<name>_bench_scale` (`..._quick` when `fresh`: a quick run
    never touches a full run's database), created by the owner role, dropped first when `fresh`."""
    url, owner = os.environ.get("DATABASE_URL", ""), os.environ.get("DATABASE_OWNER_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not owner:
        return None
    import psycopg

    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_scale"
    name += "_quick" if fresh else ""
    with psycopg.connect(_admin(owner), autocommit=True) as c:
        if fresh:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            c.execute(f'CREATE DATABASE "{name}"')
    return _beside(url, f"/{name}"), _beside(owner, f"/{name}"), name


def _drop(owner_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(_admin(owner_url), autocommit=True) as c:
        # The runtime role's sessions may still be closing (a pool closes its connections in the
        # background), and the owner may not terminate another role's session: WITH (FORCE) then
        # fails (seen in CI on a loaded machine). Wait for them to go, at most 30 s.
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename <> current_user", [name]
            ).fetchone()[0]
        ):
            time.sleep(0.1)
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
        from tenants.scoping import tenant_context

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

        stream, records = self.batch()
        start = time.perf_counter()
        services.ingest(self.tenant, stream, records, actor="bench")
        took = time.perf_counter() - start
        self.total += len(records)
        self.since_integrate += 1
        if self.since_integrate >= INTEGRATE_EVERY:
            self.integrate()
        return took

    def integrate(self) -> float:
        from transparency import services as transparency

        start = time.perf_counter()
        transparency.integrate_fully(self.tenant)
        took = time.perf_counter() - start
        self.integrate_s += took
        self.integrated += self.since_integrate * BATCH
        self.since_integrate = 0
        autovacuum_stand_in()  # not timed: autovacuum's work is the server's, beside ingest
        return took


def _api(client: Any, path: str, params: dict[str, Any], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        response = client.get(path, params)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, (path, response.status_code, response.content[:300])
    return samples


def _sizes(records: int) -> dict[str, Any] | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute("SELECT pg_table_size(%s), pg_indexes_size(%s)", [table, table])
            table_bytes, index_bytes = cursor.fetchone()
            per = records / 1_000_000
            out[table] = {
                "table_mib_per_million": round(table_bytes / per / 2**20, 1),
                "index_mib_per_million": round(index_bytes / per / 2**20, 1),
            }
        cursor.execute("SELECT pg_database_size(current_database())")
        out["database_gib"] = round(cursor.fetchone()[0] / 2**30, 2)
    out["disk_free_gib"] = round(shutil.disk_usage("/").free / 2**30, 1)
    return out


def _index_blocks() -> dict[str, tuple[int, int]]:
    """Blocks each index of the big tables read from outside shared_buffers, and found in them."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexrelname, idx_blks_read, idx_blks_hit FROM pg_statio_user_indexes"
            " WHERE relname = ANY(%s)",
            [TABLES],
        )
        return {name: (read, hit) for name, read, hit in cursor.fetchall()}


def _blocks_per_1000(before: dict[str, tuple[int, int]], records: int) -> dict[str, float]:
    """Index blocks read from outside shared_buffers per 1,000 records since `before`, the five
    largest (the random-order index shows up here; indexes that grow in order barely read)."""
    after = _index_blocks()
    delta = {name: after[name][0] - before.get(name, (0, 0))[0] for name in after}
    top = sorted(delta.items(), key=lambda kv: -kv[1])[:5]
    return {name: round(read * 1000 / records, 1) for name, read in top if records}


def _plans(tenant: Any) -> dict[str, list[str]] | None:
    """EXPLAIN ANALYZE of the list's first page by a common and a rare tool, as the API runs it:
    the runtime role, the tenant active (row-level security on)."""
    from django.db import connection

    from sagas import selectors
    from tenants.scoping import tenant_context

    if connection.vendor != "postgresql":
        return None
    out = {}
    with tenant_context(tenant):
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            role = cursor.fetchone()[0]
        for tool in ("tool.1", "tool.rare"):
            page = selectors.newest_first(selectors.with_step_tool(selectors.all_sagas(), tool))[:51]
            # the planner's own choice for the EXISTS form (why newest_page bounds its walk)
            out[f"EXISTS tool={tool} (as {role})"] = page.explain(analyze=True, buffers=True).splitlines()
    return out


def _listing(client: Any, tenant: Any, queries: int) -> dict[str, float]:
    from sagas.models import Saga
    from tenants.scoping import tenant_context

    with tenant_context(tenant):
        newest = Saga.objects.order_by("-last_activity_at").values_list("last_activity_at", flat=True).first()
    since = (newest.timestamp() - 3000) if newest else 0
    listing = {
        "all": _api(client, "/api/v1/sagas", {}, queries),
        "status=completed": _api(client, "/api/v1/sagas", {"status": "completed"}, queries),
        "status=running": _api(client, "/api/v1/sagas", {"status": "running"}, queries),
        "tool=tool.1": _api(client, "/api/v1/sagas", {"tool": "tool.1"}, queries),
        "tool=tool.rare": _api(client, "/api/v1/sagas", {"tool": "tool.rare"}, queries),
        "tool=tool.1&status=completed": _api(
            client, "/api/v1/sagas", {"tool": "tool.1", "status": "completed"}, queries
        ),
        "since=newest-3000s": _api(client, "/api/v1/sagas", {"since": str(since)}, queries),
    }
    pages = []
    for _ in range(max(1, queries // 20)):
        url = client.get("/api/v1/sagas").json()["next"]
        for _ in range(20):
            if not url:
                break
            start = time.perf_counter()
            response = client.get(url)
            pages.append(time.perf_counter() - start)
            url = response.json()["next"]
    listing["pages 2-21 by cursor"] = pages
    return {name: _pct(samples, 0.95) for name, samples in listing.items() if samples}


def _page_listing(tenant: Any, queries: int) -> dict[str, float]:
    """The dashboard's saga list page (p95 ms) as the tenant's owner sees it, the whole page:
    status tabs (capped counts), filter choices, rows; then Older pages 2-11 by cursor."""
    import html
    import re

    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(email=f"owner@{tenant.slug}.example"))
    listing = {
        name: _api(client, "/sagas/", params, queries)
        for name, params in {
            "all": {},
            "status=completed": {"status": "completed"},
            "status=orphaned": {"status": "orphaned"},
            "tool=tool.1": {"tool": "tool.1"},
            "tool=tool.rare": {"tool": "tool.rare"},
            "since=24h": {"since": "24h"},
        }.items()
    }
    older = re.compile(r'<a href="([^"]*)" rel="next">')
    pages = []
    for _ in range(max(1, queries // 10)):
        found = older.search(client.get("/sagas/").content.decode())
        for _ in range(10):
            if not found:
                break
            start = time.perf_counter()
            response = client.get("/sagas/" + html.unescape(found.group(1)))
            pages.append(time.perf_counter() - start)
            found = older.search(response.content.decode())
    listing["Older pages 2-11"] = pages
    return {name: _pct(samples, 0.95) for name, samples in listing.items() if samples}


def _proofs(client: Any, tenant: Any, queries: int) -> dict[str, Any]:
    from tenants.scoping import tenant_context
    from transparency.models import Checkpoint

    with tenant_context(tenant):
        signed = Checkpoint.objects.order_by("-size").values_list("size", flat=True).first() or 0
    leaves = [random.randrange(signed) for _ in range(queries)]
    inclusion: list[float] = []
    consistency: list[float] = []
    # Untimed: a process's first request loads the URL configuration and the middleware (~120 ms
    # seen at the first rung, a p99 of 126 ms for 200 proofs), and each route's first answer
    # primes the lean proof path.
    _api(client, "/api/v1/audit/proofs/inclusion", {"index": 0}, 1)
    _api(client, "/api/v1/audit/proofs/consistency", {"first": 1}, 1)
    for leaf in leaves:
        inclusion += _api(client, "/api/v1/audit/proofs/inclusion", {"index": leaf}, 1)
    # Leaves of their own: the inclusion proofs just read their leaves' neighbourhoods.
    firsts = [random.randrange(1, signed + 1) for _ in range(queries)]
    for first in firsts:
        consistency += _api(client, "/api/v1/audit/proofs/consistency", {"first": first}, 1)
    # The same proofs without the request path (authentication, middleware, DRF, JSON): what the
    # tree's storage costs at this size, beside what the API adds.
    from transparency import proofs

    core_inclusion, core_consistency = [], []
    with tenant_context(tenant):
        for leaf in leaves:
            start = time.perf_counter()
            proofs.inclusion(leaf)
            core_inclusion.append(time.perf_counter() - start)
        for first in firsts:
            start = time.perf_counter()
            proofs.consistency(first)
            core_consistency.append(time.perf_counter() - start)
    return {
        "signed_size": signed,
        "inclusion_ms": {"p50": _pct(inclusion, 0.5), "p99": _pct(inclusion, 0.99)},
        "consistency_ms": {"p50": _pct(consistency, 0.5), "p99": _pct(consistency, 0.99)},
        "without_request_path_ms": {
            "inclusion": {"p50": _pct(core_inclusion, 0.5), "p99": _pct(core_inclusion, 0.99)},
            "consistency": {"p50": _pct(core_consistency, 0.5), "p99": _pct(core_consistency, 0.99)},
        },
    }


def _export(tenant: Any, signed: int, tmp: str) -> dict[str, Any]:
    """Build a WORM export of the newest EXPORT_WINDOW signed leaves; verify it offline."""
    from sagaplane.export import verify_export

    from tenants.scoping import tenant_context
    from transparency import services
    from transparency.models import Export
    from transparency.storage import get_storage

    first = max(0, signed - EXPORT_WINDOW)
    export = services.request_export(tenant, actor="system:bench", first=first, end=signed)
    start = time.perf_counter()
    services.build_export(tenant, export.pk)
    build_s = time.perf_counter() - start
    with tenant_context(tenant):
        stored = Export.objects.get(pk=export.pk)
        vkey = services.current_verifier_keys()[0]
    archive = Path(tmp) / "export.tar.gz"
    with get_storage().open(stored.storage_name) as src:
        archive.write_bytes(src.read())
    start = time.perf_counter()
    report = verify_export(str(archive), vkey)
    verify_s = time.perf_counter() - start
    archive.unlink()
    return {
        "leaves": signed - first,
        "build_s": round(build_s, 2),
        "build_records_per_s": round((signed - first) / build_s),
        "verify_records_per_s": round(report.records / verify_s),
        "archive_bytes": stored.size if hasattr(stored, "size") else None,
    }


@contextlib.contextmanager
def _as_owner() -> Any:
    """An autocommit connection as the tables' owner (what ANALYZE needs), or None without one."""
    owner = os.environ.get("DATABASE_OWNER_URL", "")
    if not owner:
        yield None
        return
    import psycopg

    with psycopg.connect(owner.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
        yield c


GROWING_TABLES = (
    "audit_record",
    "audit_recordpayload",
    "sagas_saga",
    "sagas_step",
    "transparency_treenode",
    "recovery_lease",
)
ANALYZED: dict[str, Any] = {"server_autovacuum": None, "analyzes": 0}


def autovacuum_stand_in() -> None:
    """On a server running with `autovacuum = off` (this machine's shared Postgres does), ANALYZE
    each growing table once its changes since the last ANALYZE pass autovacuum's own trigger
    (`autovacuum_analyze_threshold` + `autovacuum_analyze_scale_factor` x its rows: 50 + 10% by
    default, the table's own settings first), as autovacuum would in production. Without it a
    grown tenant's tables are never analyzed, and the planner's guesses for them (a tenant of
    1.2M steps taken for 748 rows) are not what a production tenant meets. With autovacuum on,
    nothing: the server does it."""
    with _as_owner() as c:
        if c is None:
            return
        settings = dict(
            c.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('autovacuum', 'autovacuum_analyze_threshold', 'autovacuum_analyze_scale_factor')"
            ).fetchall()
        )
        ANALYZED["server_autovacuum"] = settings["autovacuum"]
        if settings["autovacuum"] == "on":
            return
        threshold = float(settings["autovacuum_analyze_threshold"])
        factor = float(settings["autovacuum_analyze_scale_factor"])
        due = []
        for name, changed, rows, options in c.execute(
            "SELECT s.relname, s.n_mod_since_analyze, greatest(c.reltuples, s.n_live_tup), c.reloptions "
            "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid WHERE s.relname = ANY(%s)",
            [list(GROWING_TABLES)],
        ).fetchall():
            # A table's own setting first (the migrations set 0.02 on the record and saga tables).
            own = dict(option.split("=", 1) for option in options or [])
            table_factor = float(own.get("autovacuum_analyze_scale_factor", factor))
            if changed > float(own.get("autovacuum_analyze_threshold", threshold)) + table_factor * rows:
                due.append(name)
        for name in due:
            c.execute(f"ANALYZE {name}")
            ANALYZED["analyzes"] += 1


def _analyze() -> None:
    """ANALYZE the saga tables (as their owner), as autovacuum would have by now: growing a table
    by a million rows in minutes outruns it, and stale statistics are not what a tenant meets."""
    with _as_owner() as c:
        if c is not None:
            c.execute("ANALYZE sagas_saga, sagas_step")


def measure(grower: Grower, client: Any, queries: int, tmp: str) -> dict[str, Any]:
    from django.db import connection

    load_before = _load()
    _analyze()
    integrate_s = grower.integrate()
    proofs = _proofs(client, grower.tenant, queries)
    result = {
        "records": grower.total,
        "integrate_rest_s": round(integrate_s, 2),
        **proofs,
        "saga_list_p95_ms": _listing(client, grower.tenant, queries),
        "saga_list_page_p95_ms": _page_listing(grower.tenant, queries),
        "export": _export(grower.tenant, proofs["signed_size"], tmp),
        "sizes": _sizes(grower.total),
        "plans": _plans(grower.tenant),
        "database": connection.vendor,
        "load_average_before": load_before,
        "load_average_after": _load(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "plans"}), flush=True)
    return result


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
                "load_average": _load(),
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

    from tenants import services as tenant_services

    _, raw = tenant_services.create_api_key(tenant, name="bench", scopes=["ingest", "read"], actor="bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _tenant(slug: str) -> Any:
    from tenants import services as tenant_services
    from tenants.models import Tenant

    found = Tenant.objects.filter(slug=slug).first()
    return found or tenant_services.create_tenant(slug, slug.title(), f"owner@{slug}.example", actor="bench")


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
                    blocks, blocks_from = _index_blocks(), grower.total + peer.total
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
                report.data["curve"][-1]["index_blocks_read_per_1000_records"] = _blocks_per_1000(
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
                    "load_average": _load(),
                    "at": time.strftime("%H:%M:%S", time.gmtime()),
                }
            )
            print(json.dumps(blocks[-1]), flush=True)
            report.write()
        if (i in (100, 250, 500, 750) or i == count) and not any(x["tenants"] == i for x in samples):
            try:
                _analyze()
                client = _client_for(tenant)
                samples.append(
                    {
                        "tenants": i,
                        "newest_tenant": {
                            **_proofs(client, tenant, queries),
                            "saga_list_p95_ms": _listing(client, tenant, queries),
                        },
                        "big_tenant_beside_them": {
                            "records": big.total,
                            **_proofs(big_client, big.tenant, queries),
                            "saga_list_p95_ms": _listing(big_client, big.tenant, queries),
                        },
                        "sizes": _sizes(big.total + i * per),
                        "load_average": _load(),
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
    database = _own_database(fresh=False)
    # No migrate: it re-applies the row-level security policies, which waits for a running
    # growth's transactions, and the grown schema is what is being measured.
    _setup(data_dir, database, migrate=False)
    tenant = _tenant("scale")
    grower = Grower(tenant)
    _analyze()
    client = _client_for(tenant)
    out = {
        "benchmark": "scale-list",
        "records": grower.total,
        "database_gib": (_sizes(grower.total) or {}).get("database_gib"),
        "proofs": _proofs(client, tenant, queries),
        "saga_list_p95_ms": _listing(client, tenant, queries),
        "saga_list_page_p95_ms": _page_listing(tenant, queries),
        "plans": _plans(tenant),
        "load_average": _load(),
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
    database = _own_database(fresh=args.quick)
    name = "scale-quick.json" if args.quick else "scale.json"
    report = Report(ROOT / "bench" / "results" / name, keep=not args.quick, quick=args.quick)
    report.data["runs"].append(
        {
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "load_average": _load(),
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
                _drop(database[1], database[2])
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
