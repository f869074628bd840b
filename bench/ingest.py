"""Ingest benchmark (issue 3): agent-saga-format records pushed through the real HTTP API.

Production-like: uvicorn with 2 workers on 127.0.0.1, Postgres (DATABASE_URL) and Redis
(REDIS_URL) from the environment. Concurrent clients each own a stream and POST batches in order.
Prints accepted records/s and p50/p99 batch latency, and, measured in the same run on the same
records, agent-saga's in-process `integrity.verify` records/s and a raw Postgres COPY rows/s (one
COPY process per client, concurrently), as ratios; and where a batch's time goes on the server
(parse, verify, rows, insert, projection, commit: the answers' Server-Timing header), per batch.
Writes bench/results/ingest.json.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/ingest.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tenants.actors import system_actor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.ports import free_port  # noqa: E402
from tests.support.probes import healthy  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402


def _records(n: int, start_prev: str) -> list[dict[str, Any]]:
    """n records shaped like agent-saga's (sagas of intent/commit pairs), chained with agent-saga's rule."""
    from agent_saga import integrity

    out: list[dict[str, Any]] = []
    prev = start_prev
    saga_id = ""
    ts = time.time()
    for seq in range(1, n + 1):
        phase = (seq - 1) % 6
        if phase == 0:
            saga_id = uuid.uuid4().hex
            body: dict[str, Any] = {"event": "SAGA_START", "saga_id": saga_id, "pid": 4242, "lease_ttl": 5.0}
        elif phase == 5:
            body = {"event": "SAGA_COMPLETE", "saga_id": saga_id, "clean": True}
        elif phase % 2 == 1:
            step_id = uuid.uuid4().hex
            body = {
                "event": "STEP_INTENT",
                "saga_id": saga_id,
                "step_id": step_id,
                "tool": "payments.charge",
                "semantics": "COMPENSABLE",
                "kwargs": {"amount": seq, "currency": "EUR"},
            }
        else:
            body = {
                "event": "STEP_COMMITTED",
                "saga_id": saga_id,
                "step_id": step_id,
                "tool": "payments.charge",
                "semantics": "COMPENSABLE",
                "compensation": {
                    "fn": "refund",
                    "handler": "payments.refund",
                    "recoverable": True,
                    "description": "refund",
                    "idempotency_key": uuid.uuid4().hex,
                    "kwargs": {"charge_id": f"ch_{seq}"},
                },
            }
        record = {"seq": seq, "event": body.pop("event"), "ts": ts + seq * 1e-4, **body}
        prev = integrity.stamp(record, prev)
        out.append(record)
    return out


def _setup_tenant() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from core.scoping import tenant_context
    from tenants import founding, services

    slug = f"bench-{uuid.uuid4().hex[:8]}"
    tenant = founding.create_tenant(
        slug, "Bench", f"owner@{slug}.example", "bench-password-123", actor=system_actor("bench")
    )
    with tenant_context(tenant):  # tenants' services assert the scope, as a command enters it
        _, key = services.create_api_key(
            tenant, services.NewApiKey(name="bench", scopes=["ingest", "read"]), actor=system_actor("bench")
        )
    return key


def _copy_one(url: str, n: int, rows: list[dict[str, Any]], start: Any) -> tuple[float, float]:
    """One COPY client (a process of its own): its stream's rows into a temp table, each row's
    payload JSON made as it goes (ingest makes it too). Returns (start, end) wall times."""
    import psycopg

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE bench_copy (stream text, position bigint, seq bigint, ts double precision, "
            "event text, cd text, ph text, h text, saga_id text, fields text, salt text)"
        )
        start.wait()
        started = time.time()
        with cur.copy("COPY bench_copy FROM STDIN") as copy:
            for position, r in enumerate(rows, 1):
                fields = {
                    k: v for k, v in r.items() if not k.startswith("_") and k not in ("seq", "ts", "event")
                }
                copy.write_row(
                    (
                        f"s{n}",
                        position,
                        r["seq"],
                        r["ts"],
                        r["event"],
                        r["_cd"],
                        r["_ph"],
                        r["_h"],
                        r.get("saga_id", ""),
                        json.dumps(fields),
                        r["_s"],
                    )
                )
        conn.commit()
        return started, time.time()


def _copy_rows_per_s(streams: list[list[dict[str, Any]]]) -> float:
    """The floor: a raw Postgres COPY of the same rows, one client process per ingest client, all
    at once (as the ingest clients ran)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(len(streams))
        with context.Pool(len(streams)) as pool:
            spans = pool.starmap(
                _copy_one, [(os.environ["DATABASE_URL"], n, rows, start) for n, rows in enumerate(streams)]
            )
    return sum(len(rows) for rows in streams) / (max(end for _, end in spans) - min(s for s, _ in spans))


def _breakdown(timings: list[dict[str, float]], latencies: list[float]) -> dict[str, Any]:
    """Mean milliseconds per batch of each server phase (the answers' Server-Timing), and what
    the phases leave of the client's latency (HTTP, authentication, the answer, queueing)."""
    names: list[str] = []
    for phases in timings:
        names += [name for name in phases if name not in names]
    mean = {name: sum(p.get(name, 0.0) for p in timings) / len(timings) for name in names}
    latency_ms = statistics.fmean(latencies) * 1000
    server = sum(mean.values())
    out: dict[str, Any] = {f"{name}_ms": round(value, 2) for name, value in mean.items()}
    out["phases_total_ms"] = round(server, 2)
    out["outside_phases_ms"] = round(latency_ms - server, 2)
    out["batch_latency_mean_ms"] = round(latency_ms, 2)
    out["share"] = {name: round(value / latency_ms, 3) for name, value in mean.items()}
    out["share"]["outside_phases"] = round((latency_ms - server) / latency_ms, 3)
    return out


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the results
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts for CI (< 60 s)")
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None, help="batches per client")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        raise SystemExit("set DATABASE_URL=postgres://... and REDIS_URL=redis://... (production-like run)")
    # Agents ship in batches (the SDK's shipper: 500 records per POST by default, configurable;
    # the server accepts up to SAGAPLANE_MAX_BATCH_RECORDS); a few agents ship concurrently, each
    # on its own stream, all in one tenant, so every batch also contends for the tenant's log lock.
    # One client per server worker: on 2 cores more clients only queue (4 clients: 8.3k/s; 2: 10.4k/s).
    clients = args.clients or 2
    batches = args.batches or (8 if args.quick else 50)
    size = args.batch_size or 1000

    import httpx
    from agent_saga import integrity

    from core.timing import parse_header

    load_before = os.getloadavg()[0]
    key = _setup_tenant()
    streams = [_records(batches * size, "0" * 64) for _ in range(clients)]

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DEBUG": "0", "LOG_LEVEL": "WARNING"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    latencies: list[float] = []
    timings: list[dict[str, float]] = []
    errors: list[str] = []
    lock = threading.Lock()
    try:
        wait_until(lambda: healthy(url), "the server to become ready", alive=server)

        # Bodies are serialised before the clock starts: agents build their batches on their own
        # machines, so the client's JSON encoding is not part of what the server is measured on.
        bodies = [
            [json.dumps({"records": records[b * size : (b + 1) * size]}).encode() for b in range(batches)]
            for records in streams
        ]

        def client(n: int) -> None:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
                for body in bodies[n]:
                    t0 = time.perf_counter()
                    response = http.post(
                        f"/api/v1/streams/bench-{n}/records",
                        content=body,
                        headers={"Content-Type": "application/json"},
                    )
                    elapsed = time.perf_counter() - t0
                    with lock:
                        latencies.append(elapsed)
                        timings.append(parse_header(response.headers.get("server-timing", "")))
                        if response.status_code != 200 or response.json()["accepted"] != size:
                            errors.append(f"{response.status_code} {response.text[:200]}")

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    if errors:
        raise SystemExit(f"{len(errors)} batch(es) failed, first: {errors[0]}")

    total = clients * batches * size
    ingest_rps = total / wall
    t0 = time.perf_counter()
    for records in streams:
        assert integrity.verify(records).intact
    verify_rps = total / (time.perf_counter() - t0)
    copy_rps = _copy_rows_per_s(streams)
    breakdown = _breakdown(timings, latencies)
    latencies.sort()
    result = {
        "mode": "quick" if args.quick else "full",
        "database": "postgresql",  # the only store this benchmark runs on (see the check above)
        "clients": clients,
        "batches_per_client": batches,
        "batch_size": size,
        "server_workers": args.workers,
        "records": total,
        "seconds": round(wall, 3),
        "ingest_records_per_s": round(ingest_rps, 1),
        "batch_latency_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "batch_latency_p99_ms": round(
            latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 1
        ),
        "agent_saga_verify_records_per_s": round(verify_rps, 1),
        "postgres_copy_rows_per_s": round(copy_rps, 1),
        "ratio_ingest_to_agent_saga_verify": round(ingest_rps / verify_rps, 3),
        "ratio_ingest_to_postgres_copy": round(ingest_rps / copy_rps, 3),
        "target_ratio_to_copy": 0.3,
        "copy_clients": clients,
        # Mean per batch, from the server's Server-Timing answers: parse (JSON + record checks),
        # verify (the chain walk), rows (leaf hashes, payload JSON), insert_payloads (ids and
        # payloads, before the lock), projection_fold (sagas and steps read and folded, before the
        # lock), log_lock (waiting for the tenant log lock: each append holds it from here through
        # its projection write and commit, so a tenant's appends serialise), insert_locked
        # (headers, stream head, log size), projection_write (the fold's upsert, under the lock),
        # commit.
        "per_batch_breakdown": breakdown,
        "target_records_per_s": 10_000,
        # This machine is shared: other work running during the benchmark lowers the numbers.
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    # Quick runs (CI) never overwrite the full run's numbers.
    out = ROOT / "bench" / "results" / ("ingest-quick.json" if args.quick else "ingest.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for k, v in result.items():
        if k != "per_batch_breakdown":
            print(f"{k:40} {v}")
    print("per batch (mean ms):")
    for k, v in breakdown.items():
        print(f"  {k:38} {v}")


if __name__ == "__main__":
    main()
