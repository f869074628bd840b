"""What one tenant's ingest costs as it grows, per index (Postgres only): a before/after tool for
schema changes to the record tables, cheaper than `bench/scale.py`'s full ladder.

Grows tenant "scale" through the real ingest service (`bench/scale.py`'s `Grower`: batches of
1,000 chained records over 10 agent streams, integrated every 100 batches) through each of `--at` (records).
At each, over a window of 100 batches, it reports:
- ingest records/s of the median batch, and of a fresh tenant's batch fed after each one (the
  peer: the same load, so `ratio_to_peer` is the size's cost with the machine's load taken out);
- WAL bytes per 1,000 records written by the big tenant's batches alone (`pg_walinspect` over each
  batch's own LSN range, only this database's blocks: other databases on a shared server do not
  count), split into records and full-page images, and per relation;
- index blocks read from outside shared_buffers per 1,000 records (`pg_statio_user_indexes`,
  the window's batches, the peer's included: its indexes are small and cached);
- the median milliseconds of each ingest phase (`core.timing`), the big tenant's and the
  peer's: which part of a batch grows with the tenant;
- checkpoints during the window (they decide how many full-page images follow) and load.

It works in its own database `<DATABASE_URL's name>_ingest_<label>`, created fresh (pg_walinspect
needs the superuser, `--superuser-url`), and drops it at the end unless `--keep`; `--reuse` grows
the one a `--keep` run left (no migrate: the schema as it stands is what is measured). Results go
to a JSON-lines file in /tmp, not bench/results: a run is one side of a before/after comparison.

    .venv/bin/python bench/ingest_growth.py --label before --at 100000,1000000,2500000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from tenants.actors import system_actor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sdk"))
sys.path.insert(0, str(ROOT / "bench"))

import scale  # noqa: E402  (bench/scale.py: the grower)

from bench.support.scale_database import ANALYZED, TABLES, admin_url, beside, drop_database  # noqa: E402

WINDOW = 100  # batches


def _database(label: str, reuse: bool) -> tuple[str, str, str]:
    url, owner = os.environ["DATABASE_URL"], os.environ["DATABASE_OWNER_URL"]
    name = f"{urllib.parse.urlsplit(url).path.lstrip('/')}_ingest_{label}"
    import psycopg

    if not reuse:
        with psycopg.connect(admin_url(owner), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{name}"')
    return beside(url, f"/{name}"), beside(owner, f"/{name}"), name


class Wal:
    """This database's WAL between two LSNs, by relation (a superuser session: pg_walinspect)."""

    def __init__(self, superuser_url: str, name: str) -> None:
        import psycopg

        self.conn = psycopg.connect(beside(superuser_url, f"/{name}"), autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        self.oid = self.conn.execute("SELECT oid FROM pg_database WHERE datname = %s", [name]).fetchone()[0]

    def lsn(self, flushed: bool = False) -> str:
        """Where WAL is being inserted (a start), or flushed to (an end: the batch committed, so
        its WAL is flushed, and pg_walinspect reads no further than that)."""
        which = "flush" if flushed else "insert"
        return str(self.conn.execute(f"SELECT pg_current_wal_{which}_lsn()").fetchone()[0])

    def between(self, start: str, end: str, into: dict[str, list[int]]) -> None:
        """Adds (record bytes, full-page-image bytes) per relfilenode of this database to `into`."""
        rows = self.conn.execute(
            "SELECT substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)'), sum(record_length),"
            " sum(fpi_length) FROM pg_get_wal_records_info(%s, %s)"
            " WHERE block_ref LIKE %s GROUP BY 1",
            [start, end, f"%rel %/{self.oid}/%"],
        ).fetchall()
        for rel, length, fpi in rows:
            total = into.setdefault(rel, [0, 0])
            total[0] += int(length)
            total[1] += int(fpi)

    def names(self) -> dict[str, str]:
        return {
            str(node): name
            for node, name in self.conn.execute(
                "SELECT relfilenode, relname FROM pg_class WHERE relfilenode <> 0"
            ).fetchall()
        }

    def checkpoints(self) -> int:
        row = self.conn.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").fetchone()
        return int(row[0])


def _blocks() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT indexrelname, idx_blks_read FROM pg_statio_user_indexes WHERE relname = ANY(%s)",
            [TABLES],
        )
        return dict(cursor.fetchall())


def _ingest(grower: scale.Grower, phases: list[dict[str, float]] | None = None) -> float:
    """One batch through ingest, timed (its phases appended to `phases`); integration (every 100
    batches) is left to the caller."""
    from audit import services
    from core import timing
    from core.scoping import tenant_context

    stream, records = grower.batch()
    start = time.perf_counter()
    with timing.collecting() as marked, tenant_context(grower.tenant):  # as the ingest view enters it
        services.ingest(grower.tenant, stream, records, actor=system_actor("bench"))
    took = time.perf_counter() - start
    if phases is not None:
        phases.append(marked)
    grower.total += len(records)
    grower.since_integrate += 1
    return took


def _medians(phases: list[dict[str, float]]) -> dict[str, float]:
    names = {name for marked in phases for name in marked}
    return {
        name: round(sorted(m.get(name, 0.0) for m in phases)[len(phases) // 2] * 1000, 1)
        for name in sorted(names)
    }


def window(grower: scale.Grower, wal: Wal, mark: int, batches: int) -> dict[str, Any]:
    peer = scale.Grower(scale._tenant(f"peer{mark}"))
    big_s: list[float] = []
    peer_s: list[float] = []
    per_rel: dict[str, list[int]] = {}
    big_phases: list[dict[str, float]] = []
    peer_phases: list[dict[str, float]] = []
    blocks, checkpoints, load = _blocks(), wal.checkpoints(), os.getloadavg()[0]
    records = 0
    for _ in range(batches):
        start = wal.lsn()
        big_s.append(_ingest(grower, big_phases))
        wal.between(start, wal.lsn(flushed=True), per_rel)
        records += scale.BATCH
        peer_s.append(_ingest(peer, peer_phases))
        if grower.since_integrate >= scale.INTEGRATE_EVERY:
            grower.integrate()
        if peer.since_integrate >= scale.INTEGRATE_EVERY:
            peer.integrate()
    after = _blocks()
    names = wal.names()
    rate = scale.BATCH / sorted(big_s)[len(big_s) // 2]
    peer_rate = scale.BATCH / sorted(peer_s)[len(peer_s) // 2]
    per_1000 = 1000 / records
    by_name = sorted(
        ((names.get(rel, rel), length, fpi) for rel, (length, fpi) in per_rel.items()), key=lambda r: -r[1]
    )
    read = {name: after[name] - blocks.get(name, 0) for name in after}
    return {
        "records": grower.total,
        "ingest_records_per_s": round(rate, 1),
        "peer_ingest_records_per_s": round(peer_rate, 1),
        "ratio_to_peer": round(rate / peer_rate, 3),
        "wal_bytes_per_1000_records": round(sum(r[1] for r in by_name) * per_1000),
        "wal_fpi_bytes_per_1000_records": round(sum(r[2] for r in by_name) * per_1000),
        "wal_bytes_per_1000_by_relation": {
            name: [round(length * per_1000), round(fpi * per_1000)] for name, length, fpi in by_name[:8]
        },
        "index_blocks_read_per_1000_records": {
            name: round(n * per_1000, 1) for name, n in sorted(read.items(), key=lambda kv: -kv[1])[:6]
        },
        # median ms per ingest phase (audit.services' timing marks), the big tenant's and the peer's
        "phases_ms": {"big": _medians(big_phases), "peer": _medians(peer_phases)},
        "checkpoints": wal.checkpoints() - checkpoints,
        # The server's autovacuum setting and the ANALYZEs the growth made in its stead (scale.py).
        "autovacuum": dict(ANALYZED),
        "load_average": [load, os.getloadavg()[0]],
        "at": time.strftime("%H:%M:%S", time.gmtime()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--label", default="run", help="names the database and the output file")
    parser.add_argument("--quick", action="store_true", help="a few batches, to keep it working (CI)")
    parser.add_argument("--window", type=int, default=WINDOW, help="batches per window")
    parser.add_argument("--at", default="100000,1000000,2000000,2500000", help="window ends (records)")
    parser.add_argument("--superuser-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--reuse", action="store_true", help="grow the database a --keep run left")
    parser.add_argument("--out", help="JSON lines file (default /tmp/ingest-growth-<label>.jsonl)")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        print("ingest_growth: Postgres only (WAL and buffer counters); skipped without DATABASE_URL")
        return 0
    if args.quick:
        args.label, args.window, args.at, args.keep, args.reuse = "quick", 2, "2000,4000", False, False
    marks = sorted(int(m) for m in args.at.split(","))
    database = _database(args.label, args.reuse)
    out = Path(args.out or f"/tmp/ingest-growth-{args.label}.jsonl")
    wal: Wal | None = None
    with tempfile.TemporaryDirectory(prefix="sagaplane-ingest-growth-") as tmp:
        try:
            scale._setup(tmp, database, migrate=not args.reuse)
            wal = Wal(args.superuser_url, database[2])
            grower = scale.Grower(scale._tenant("scale"))
            for mark in marks:
                while grower.total < mark - args.window * scale.BATCH:
                    _ingest(grower)
                    if grower.since_integrate >= scale.INTEGRATE_EVERY:
                        grower.integrate()
                result = {"label": args.label, **window(grower, wal, mark, args.window)}
                print(json.dumps(result), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(result) + "\n")
        finally:
            if wal is not None:
                wal.conn.close()
            from django.db import connections

            for connection in connections.all():
                if hasattr(connection, "close_pool"):
                    connection.close_pool()
            connections.close_all()
            if not args.keep:
                drop_database(database[1], database[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
