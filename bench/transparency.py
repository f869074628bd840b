"""Transparency-log benchmark (issue 4).

Builds an N-leaf tenant log through the real ingest service (1,000,000 leaves; `--quick`: 20,000),
integrates it, then measures: integration throughput, inclusion and consistency proof latency
(p50/p99) in-process and through the HTTP API, time from an accepted batch to the signed
checkpoint that covers it (p95, hook-driven integration; the 1 s beat bounds the fallback), and
offline verification of a WORM export (records/s). In the same run, pymerkle (the ratio anchor)
builds the same tree and answers the same proofs.

Runs against a throw-away embedded database unless DATABASE_URL is set.
Results: bench/results/transparency.json (quick: transparency-quick.json; --leaves N:
transparency-N.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup(data_dir: str) -> None:
    os.environ.setdefault("SAGAPLANE_DATA_DIR", data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # ms


def _timed(fn: Any, count: int) -> dict[str, float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return {"p50_ms": round(_pct(samples, 0.5), 4), "p99_ms": round(_pct(samples, 0.99), 4), "n": count}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="20,000 leaves, fewer samples (CI, < 60 s)")
    parser.add_argument("--leaves", type=int, help="override the log size")
    args = parser.parse_args()
    n = args.leaves or (20_000 if args.quick else 1_000_000)
    samples = 200 if args.quick else 2_000
    tmp = tempfile.mkdtemp(prefix="sagaplane-bench-")
    _setup(tmp)

    from django.test import Client
    from pymerkle import InmemoryTree
    from sagaplane import merkle
    from sagaplane.chain import GENESIS, stamp
    from sagaplane.export import _auto_workers as export_workers
    from sagaplane.export import read_bundle, verify_export, verify_export_files

    from audit import services as audit_services
    from tenants import services as tenant_services
    from tenants.scoping import tenant_context
    from transparency import proofs, services, tasks
    from transparency.models import Export

    slug = f"bench{int(time.time())}"
    tenant = tenant_services.create_tenant(
        slug, "Bench", f"owner@{slug}.example", "bench-password-1", actor="system:bench"
    )
    _, api_key = tenant_services.create_api_key(tenant, name="bench", scopes=["read"], actor="system:bench")

    # -- build the log through ingest (records without saga_id: the projection is not measured here)
    head, seq, batch_size = GENESIS, 0, 5_000
    build_start = time.perf_counter()
    with tenant_context(tenant):
        from audit.models import TenantLog

        base = TenantLog.objects.values_list("size", flat=True).first() or 0
    while base + seq < n:
        batch = []
        for _ in range(min(batch_size, n - base - seq)):
            seq += 1
            record = {"seq": seq, "ts": 1700000000.0 + seq, "event": "STEP_COMMITTED", "tool": "t", "i": seq}
            head = stamp(record, head, salt="00" * 16)
            batch.append(record)
        audit_services.ingest(tenant, "bench-agent", batch, actor="bench")
    ingest_s = time.perf_counter() - build_start

    start = time.perf_counter()
    services.integrate_fully(tenant)
    integrate_s = time.perf_counter() - start
    from audit.models import Record

    with tenant_context(tenant):
        checkpoint = proofs.latest_checkpoint()
        assert checkpoint is not None
        size, root = checkpoint.size, bytes(checkpoint.root)
        probe = 12345 % size
        probe_leaf = bytes(Record.objects.get(leaf_index=probe).leaf_hash)

    rng = random.Random(7)
    # -- proofs in-process (the same code path the API uses, DB reads included)
    with tenant_context(tenant):
        inclusion_ours = _timed(lambda: proofs.inclusion(rng.randrange(size), size), samples)
        consistency_ours = _timed(lambda: proofs.consistency(rng.randrange(1, size), size), samples)
        path = proofs.inclusion(probe, size)[1]
    merkle.verify_inclusion(probe_leaf, probe, size, path, root)  # what we time is also right

    # -- proofs through the API
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_key}")
    api_n = max(50, samples // 4)

    def api_get(path: str, params: dict[str, int]) -> None:
        response = client.get(path, params)
        # A failing endpoint must fail the benchmark, not time an error page.
        assert response.status_code == 200, (path, response.status_code, response.content[:200])

    api_get("/api/v1/audit/proofs/inclusion", {"index": 0})  # warm-up: the first request loads the URLconf
    inclusion_api = _timed(
        lambda: api_get("/api/v1/audit/proofs/inclusion", {"index": rng.randrange(size), "size": size}), api_n
    )
    consistency_api = _timed(
        lambda: api_get(
            "/api/v1/audit/proofs/consistency", {"first": rng.randrange(1, size), "second": size}
        ),
        api_n,
    )

    # -- pymerkle anchor: same leaves (as its entries are hashed with 0x00 too, we feed the data)
    start = time.perf_counter()
    ref = InmemoryTree(algorithm="sha256")
    for i in range(size):
        ref.append_entry(f"leaf-{i}".encode())
    pymerkle_build_s = time.perf_counter() - start
    inclusion_ref = _timed(lambda: ref.prove_inclusion(rng.randrange(size) + 1, size), samples)
    consistency_ref = _timed(lambda: ref.prove_consistency(rng.randrange(1, size), size), samples)

    # -- acceptance -> signed checkpoint (what the ingest hook's task does after commit)
    latencies = []
    for _ in range(20 if args.quick else 100):
        batch = []
        for _ in range(10):
            seq += 1
            record = {"seq": seq, "ts": 1700000000.0 + seq, "event": "STEP_COMMITTED", "i": seq}
            head = stamp(record, head, salt="00" * 16)
            batch.append(record)
        start = time.perf_counter()
        audit_services.ingest(tenant, "bench-agent", batch, actor="bench")
        tasks.integrate_tenant(tenant.pk)
        latencies.append(time.perf_counter() - start)

    # -- WORM export and its offline verification
    export_n = size if args.quick else min(size, 200_000)
    export = services.request_export(tenant, actor="system:bench", first=0, end=export_n)
    start = time.perf_counter()
    services.build_export(tenant, export.pk)
    export_build_s = time.perf_counter() - start
    with tenant_context(tenant):
        stored = Export.objects.get(pk=export.pk)
    from transparency.storage import get_storage

    archive = Path(tmp) / "export.tar.gz"
    with get_storage().open(stored.storage_name) as src:
        archive.write_bytes(src.read())
    with tenant_context(tenant):
        vkey = services.current_verifier_keys()[0]
    # What an auditor runs (`sagaplane verify-export`): read the tar.gz, check everything. Median
    # of three runs; the machine is shared, so one run can be unlucky.
    load_before = os.getloadavg()[0]
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        report = verify_export(str(archive), vkey)
        runs.append(time.perf_counter() - start)
    verify_s = sorted(runs)[1]
    # The same, split: reading the bundle, then the checks in one process and (when it forks) two.
    start = time.perf_counter()
    files = read_bundle(str(archive))
    read_s = time.perf_counter() - start
    one_process = []
    for _ in range(3):
        start = time.perf_counter()
        verify_export_files(files, vkey, workers=1)
        one_process.append(time.perf_counter() - start)
    checks_auto = []
    for _ in range(3):
        start = time.perf_counter()
        verify_export_files(files, vkey)
        checks_auto.append(time.perf_counter() - start)

    results = {
        "mode": "quick" if args.quick else "full",
        "leaves": size,
        "database": "postgresql" if os.environ.get("DATABASE_URL") else "sqlite",
        "ingest_records_per_s": round(size / ingest_s),
        "integration_leaves_per_s": round((size - base) / integrate_s),
        "inclusion_in_process": inclusion_ours,
        "consistency_in_process": consistency_ours,
        "inclusion_api": inclusion_api,
        "consistency_api": consistency_api,
        "pymerkle": {
            "build_s": round(pymerkle_build_s, 2),
            "inclusion": inclusion_ref,
            "consistency": consistency_ref,
        },
        "ratio_inclusion_p99_ours_over_pymerkle": round(
            inclusion_ours["p99_ms"] / inclusion_ref["p99_ms"], 3
        ),
        "ratio_consistency_p99_ours_over_pymerkle": round(
            consistency_ours["p99_ms"] / consistency_ref["p99_ms"], 3
        ),
        "acceptance_to_checkpoint_ms": {
            "p50": round(_pct(latencies, 0.5), 2),
            "p95": round(_pct(latencies, 0.95), 2),
            "note": "ingest commit -> integrate task -> signed note, in-process; "
            "the 1 s beat adds at most 1 s when the ingest hook is absent",
        },
        "export": {
            "records": report.records,
            "build_s": round(export_build_s, 2),
            "offline_verify_records_per_s": round(report.records / verify_s),
            "offline_verify_detail": {
                "read_bundle_s": round(read_s, 3),
                "checks_records_per_s": round(report.records / sorted(checks_auto)[1]),
                "checks_one_process_records_per_s": round(report.records / sorted(one_process)[1]),
                "processes": export_workers(report.records),
                "cpus": os.cpu_count(),
                "load_average_before": round(load_before, 2),
            },
        },
        "targets": {
            "proof_p99_ms_in_process": 5,
            "checkpoint_p95_ms": 1000,
            "export_verify_records_per_s": 100_000,
        },
    }
    results["targets_met"] = {
        "proofs": max(inclusion_ours["p99_ms"], consistency_ours["p99_ms"]) < 5,
        "checkpoint": results["acceptance_to_checkpoint_ms"]["p95"] < 1000,
        "export_verify": results["export"]["offline_verify_records_per_s"] >= 100_000,
    }
    name = "transparency-quick" if args.quick else "transparency" if n == 1_000_000 else f"transparency-{n}"
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
