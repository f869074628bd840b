"""Recovery benchmark (issue 14): draining orphaned sagas with SDK recovery workers.

N orphaned sagas x 3 committed charges each (N = 1,000; `--quick`: 100) are ingested with a 2 s
lease and no terminal record; the lease sweep runs on the Celery beat's schedule (every second,
in this process), and k `sagaplane worker` processes (k = 1, 2, 4) claim the jobs over HTTP from
the production command (gunicorn, 2 uvicorn workers, runtime role, its own Redis) and run a
handler that sleeps 20 ms (an I/O-bound refund) and writes each call to a ledger. Two series:
workers running 100 handlers at once (`--concurrency 100`: batch claims and batch results, the
latency series, `ours`) and workers running one at a time (`--concurrency 1`, the classic loop:
the scaling series, where the workers are the bottleneck). Reported per k:

- drain: first lease expiry to the last job recorded compensated (the server's clock);
- p50 / p95 from a saga's lease expiry to its takeover by the sweep (its run and jobs queued,
  the saga `recovering`), p50 / p95 / max to the start of its compensation (the saga's first
  claim: the target's definition), and p50 / p95 / max per job (each job's first claim; a
  saga's later steps wait for its newer ones, so this is bounded below by the drain);
- jobs/s, the speed-up over k = 1, and duplicates: handler calls beyond one per step (the ledger)
  and COMPENSATED records beyond one per step (the evidence). The run fails on any duplicate.

Peers measured in the same run: the floor (3N x 20 ms / (k x concurrency): the handlers' own
sleep, perfectly parallel, with zero overhead) and agent-saga's `RecoveryDaemon` (`recover_all`
over a WAL file with the same N x 3 orphaned steps and the same 20 ms handler: one process,
in-process, no network, no database). Targets (reported, not asserted): p95 < 2 s after expiry,
near-linear speed-up to 4 workers, zero duplicates. The load average before and after is
recorded (the machine is shared).

Needs Postgres (DATABASE_URL with DATABASE_OWNER_URL beside it: a database of its own,
`<name>_bench_recovery`, made by the owner role) and `redis-server`. Writes
bench/results/recovery.json (`--quick`: recovery-quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from tenants.actors import system_actor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sdk"))

from bench.support.gate_common import private_redis  # noqa: E402
from bench.support.recovery_sagas import (  # noqa: E402
    HANDLER_S,
    LEASE_TTL,
    STEPS,
    agent_saga_peer,
    ledger_of,
    saga_records,
)
from bench.support.recovery_services import (  # noqa: E402
    bench_database_urls,
    cpu_by_role,
    gunicorn,
    server_env,
)

WORKERS = (1, 2, 4)
CONCURRENCY = 100  # handlers per `sagaplane worker` (--concurrency)
SWEEP_EVERY_S = 1.0  # the Celery beat's schedule (RECOVERY_SWEEP_S)
TARGET_P95_S = 2.0

HANDLERS = textwrap.dedent(
    """
    import os, time
    import sagaplane as sp

    LEDGER = os.environ["BENCH_LEDGER"]

    @sp.compensator("bench.refund")
    def refund(charge_id, idempotency_key=None):
        started = time.time()
        time.sleep(float(os.environ.get("BENCH_HANDLER_S", "0.02")))
        with open(os.path.join(LEDGER, f"{os.getpid()}.log"), "a") as out:
            out.write(f"{idempotency_key} {charge_id} {started}\\n")
    """
)


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


# ------------------------------------------------------------------------------ own services


def _setup_django(db_url: str, owner_url: str, redis_url: str, data_dir: Path) -> None:
    from cryptography.fernet import Fernet

    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DATABASE_URL": db_url,
            "DATABASE_OWNER_URL": owner_url,
            "REDIS_URL": redis_url,
            "SAGAPLANE_DATA_DIR": str(data_dir),
            "SECRET_KEY": "bench-recovery-" + os.urandom(24).hex(),
            "SAGAPLANE_MASTER_KEY": Fernet.generate_key().decode(),
        }
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    import django

    django.setup()
    from django.core.management import call_command

    from core.rls import database_owner

    with database_owner():
        call_command("migrate", verbosity=0)


# ---------------------------------------------------------------------------------- the sagas


# ------------------------------------------------------------------------------------- ours


def ours(
    n: int,
    k: int,
    url: str,
    folder: Path,
    *,
    concurrency: int,
    sweep_every: float,
    server_pid: int,
    beat: str = "",
) -> dict[str, Any]:
    """One run. `beat` names a phase whose sweep is the deployment's own (the Celery beat's
    sweeper thread and the workers' claims): no sweep runs in this process then."""
    import resource

    from django.db import connection as db
    from django.db.models import Max, Min

    from audit import services as audit_services
    from audit.models import Record
    from core.scoping import tenant_context
    from recovery import sweeper as beat_sweeper
    from recovery.models import Job, JobState, Lease, Run
    from recovery.tasks import sweep_tenant
    from tenants import founding
    from tenants import services as tenant_services

    slug = f"rb{k}x{int(time.time() * 1000) % 10**9}"
    tenant = founding.create_tenant(slug, "Bench", f"owner@{slug}.example", actor=system_actor("bench"))
    with tenant_context(tenant):  # tenants' services assert the scope, as a command enters it
        _, key = tenant_services.create_api_key(
            tenant, tenant_services.NewApiKey(name="bench", scopes=["recovery"]), actor=system_actor("bench")
        )
    tag = f"{k}-c{concurrency}{'-' + beat if beat else ''}"
    ledger = folder / f"ledger-{tag}"
    ledger.mkdir()
    (folder / "benchhandlers.py").write_text(HANDLERS)
    records = saga_records(n, slug, ts=time.time())
    for first in range(0, len(records), 700):
        with tenant_context(tenant):  # as the ingest view enters it
            audit_services.ingest(
                tenant, f"agent-{slug}", records[first : first + 700], actor=system_actor("bench")
            )

    env = {
        k_: v
        for k_, v in os.environ.items()
        if not k_.startswith(("DJANGO_", "SAGAPLANE_", "DATABASE_", "REDIS_", "SECRET_"))
    }
    env.update(
        {
            "SAGAPLANE_URL": url,
            "SAGAPLANE_API_KEY": key,
            "BENCH_LEDGER": str(ledger),
            "BENCH_HANDLER_S": str(HANDLER_S),
            "PYTHONPATH": f"{folder}{os.pathsep}{ROOT / 'sdk'}",
        }
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "sagaplane", "worker", "--handlers", "benchhandlers", "--name", f"w{i}",
             "--lease", "30", "--wait", "5", "--concurrency", str(concurrency)],
            cwd=folder, env=env, stdout=(folder / f"worker-{tag}-{i}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for i in range(k)
    ]  # fmt: skip
    total = n * STEPS
    stop = threading.Event()
    database = db.settings_dict["NAME"]
    cpu_before = cpu_by_role(server_pid, [w.pid for w in workers], database)
    own_before = resource.getrusage(resource.RUSAGE_SELF)

    sweeps: list[float] = []
    lags: list[float] = []

    def sweeper_lag() -> float:
        return beat_sweeper.lag_seconds() or 0.0

    def tick() -> None:  # the Celery beat's ticks (a fixed schedule), one worker running them
        from django.db import connection

        tick = time.monotonic()
        try:
            while not stop.is_set():
                started = time.perf_counter()
                if sweep_tenant(tenant)["taken_over"]:
                    sweeps.append(time.perf_counter() - started)
                tick += sweep_every
                if tick < time.monotonic():  # the pass outlasted its tick: the next one is due now
                    tick = time.monotonic()
                stop.wait(max(0.0, tick - time.monotonic()))
        finally:
            connection.close()  # back to the pool: each run's beat is a new thread

    sweeper = threading.Thread(target=tick, daemon=True)
    if not beat:
        sweeper.start()
    load_before = os.getloadavg()
    try:
        deadline = time.monotonic() + 120 + total * 0.2 / k
        while True:
            with tenant_context(tenant):
                done = Job.objects.filter(state=JobState.COMPENSATED).count()
                # ... and every result's evidence chained (a result left pending is the sweep's)
                pending = audit_services.pending_server_records(tenant)
            if done >= total and not pending:
                cpu_after = cpu_by_role(server_pid, [w.pid for w in workers], database)
                own_after = resource.getrusage(resource.RUSAGE_SELF)
                break
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise SystemExit(f"k={k}: {done}/{total} compensated before the deadline")
            if beat:
                lags.append(sweeper_lag())
            time.sleep(0.5)
    finally:
        stop.set()
        if not beat:
            sweeper.join(timeout=30)
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=30)

    with tenant_context(tenant):
        expiries: dict[str, datetime] = {
            saga_id: when for saga_id, when in Lease.objects.values_list("saga_id", "expires_at") if when
        }
        starts = dict(
            Job.objects.values("saga_id")
            .annotate(first=Min("first_claimed_at"))
            .values_list("saga_id", "first")
        )
        job_starts = list(Job.objects.values_list("saga_id", "first_claimed_at"))
        taken = dict(Run.objects.values_list("saga_id", "created_at"))
        last_done = Job.objects.aggregate(last=Max("finished_at"))["last"]
        compensated_records = Counter(
            Record.objects.filter(stream__stream_id="server", event="COMPENSATED").values_list(
                "step_id", flat=True
            )
        )
    waits = [(starts[s] - expiries[s]).total_seconds() for s in expiries]
    job_waits = [(when - expiries[s]).total_seconds() for s, when in job_starts]
    takeovers = [(taken[s] - expiries[s]).total_seconds() for s in expiries]
    first_expiry = min(expiries.values())
    drain = (last_done - first_expiry).total_seconds()
    calls = Counter(key for key, _, _ in ledger_of(ledger))
    duplicate_calls = sum(c - 1 for c in calls.values())
    duplicate_records = sum(c - 1 for c in compensated_records.values())
    if len(calls) != total or duplicate_calls or duplicate_records or len(compensated_records) != total:
        raise SystemExit(
            f"k={k}: {len(calls)} steps refunded of {total}, {duplicate_calls} duplicate calls, "
            f"{duplicate_records} duplicate COMPENSATED records"
        )
    return {
        **({"phase": beat, "load_average_during": [round(x, 2) for x in os.getloadavg()]} if beat else {}),
        **({"load_average_before": [round(x, 2) for x in load_before]} if beat else {}),
        **({"sweep_lag_max_s": round(max(lags), 2) if lags else None} if beat else {}),
        "workers": k,
        "jobs": total,
        "drain_s": round(drain, 2),
        "jobs_per_s": round(total / drain, 1),
        "concurrency": concurrency,
        "floor_s": round(total * HANDLER_S / (k * concurrency), 2),
        "drain_vs_floor": round(drain / (total * HANDLER_S / (k * concurrency)), 2),
        "expiry_to_takeover_p50_s": round(_pct(takeovers, 50), 3),
        "expiry_to_takeover_p95_s": round(_pct(takeovers, 95), 3),
        "expiry_to_start_p50_s": round(_pct(waits, 50), 3),
        "expiry_to_start_p95_s": round(_pct(waits, 95), 3),
        "expiry_to_start_max_s": round(max(waits), 3),
        "expiry_to_job_start_p50_s": round(_pct(job_waits, 50), 3),
        "expiry_to_job_start_p95_s": round(_pct(job_waits, 95), 3),
        "expiry_to_job_start_max_s": round(max(job_waits), 3),
        "sweep_takeover_pass_max_s": round(max(sweeps), 3) if sweeps else None,
        # Where a job's CPU goes (2 cores shared by all of them): the whole run over its jobs.
        "cpu_ms_per_job": {
            **{role: round((cpu_after[role] - cpu_before[role]) * 1000 / total, 2) for role in cpu_after},
            "benchmark_process": round(
                (own_after.ru_utime + own_after.ru_stime - own_before.ru_utime - own_before.ru_stime)
                * 1000
                / total,
                2,
            ),
        },
        "duplicate_handler_calls": duplicate_calls,
        "duplicate_compensated_records": duplicate_records,
    }


def deployed_phases(
    n: int, url: str, server_pid: int, folder: Path, env: dict[str, str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The deployment's own takeover (beat sweeper thread, workers' claims), quiet then saturated
    (bench/support/saturation.py): one worker running `--concurrency` handlers."""
    from bench.support.saturation import celery_with_beat, saturated
    from core.scoping import tenant_context
    from tenants import founding
    from tenants import services as tenant_services

    slug = f"flood{int(time.time() * 1000) % 10**9}"
    tenant = founding.create_tenant(slug, "Flood", f"owner@{slug}.example", actor=system_actor("bench"))
    with tenant_context(tenant):  # tenants' services assert the scope, as a command enters it
        _, key = tenant_services.create_api_key(
            tenant, tenant_services.NewApiKey(name="flood", scopes=["ingest"]), actor=system_actor("bench")
        )
    out = []
    with celery_with_beat(env, folder):
        for phase in ("quiet", "saturated"):
            if phase == "saturated":
                with saturated(url, key, folder):
                    time.sleep(10)  # the flood's backlog builds before the sagas to recover arrive
                    row = ours(n, 1, url, folder, concurrency=args.concurrency, sweep_every=0,
                               server_pid=server_pid, beat=phase)  # fmt: skip
            else:
                row = ours(n, 1, url, folder, concurrency=args.concurrency, sweep_every=0,
                           server_pid=server_pid, beat=phase)  # fmt: skip
            out.append(row)
            print(
                f"  deployed, {phase}: expiry→takeover p95 {row['expiry_to_takeover_p95_s']} s, "
                f"expiry→first compensation p50 {row['expiry_to_start_p50_s']} s "
                f"p95 {row['expiry_to_start_p95_s']} s max {row['expiry_to_start_max_s']} s, "
                f"drain {row['drain_s']} s, sweep lag max {row['sweep_lag_max_s']} s, "
                f"load {row['load_average_before']} → {row['load_average_during']}",
                flush=True,
            )
    return out


# ---------------------------------------------------------------------------------- the peer


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="100 sagas (CI)")
    parser.add_argument("--sagas", type=int, help="override N")
    parser.add_argument(
        "--concurrency", type=int, default=CONCURRENCY, help=f"handlers per worker (default {CONCURRENCY})"
    )
    parser.add_argument(
        "--sweep-every",
        type=float,
        default=SWEEP_EVERY_S,
        help=f"seconds between sweeps (default {SWEEP_EVERY_S})",
    )
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)), help="worker counts to run")
    parser.add_argument(
        "--phases",
        default="quiet,saturated",
        help="quiet (the series above, the sweep in this process) and/or saturated (the deployment's "
        "own beat and workers, quiet and then saturated by a flood of ingest and CPU hogs)",
    )
    parser.add_argument(
        "--scaling-concurrency",
        type=int,
        default=1,
        help="handlers per worker in the second (scaling) series; 0 skips it (default 1)",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    n = args.sagas or (100 if args.quick else 1_000)
    folder = Path(tempfile.mkdtemp(prefix="sagaplane-bench-recovery-"))
    print(
        f"== recovery benchmark: {n} orphaned sagas x {STEPS} steps, handlers sleep {HANDLER_S * 1000:.0f} ms"
    )
    with private_redis(folder) as redis_url:
        db_url, owner_url = bench_database_urls()
        _setup_django(db_url, owner_url, redis_url, folder / "data")
        env = server_env(db_url, redis_url, folder / "data")
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            check=True,
        )
        rows: list[dict[str, Any]] = []
        scaling: list[dict[str, Any]] = []
        counts = [int(x) for x in args.workers.split(",")]
        phases = set(args.phases.split(","))
        series = [(rows, args.concurrency)] if "quiet" in phases else []
        if args.scaling_concurrency and "quiet" in phases:
            series.append((scaling, args.scaling_concurrency))
        with gunicorn(env, folder / "gunicorn.log") as (url, server_pid):
            for into, concurrency in series:
                print(f"  -- workers running {concurrency} handler(s) at once")
                for k in counts:
                    row = ours(
                        n,
                        k,
                        url,
                        folder,
                        concurrency=concurrency,
                        sweep_every=args.sweep_every,
                        server_pid=server_pid,
                    )
                    into.append(row)
                    print(
                        f"  {k} worker(s): drain {row['drain_s']} s ({row['jobs_per_s']} jobs/s, "
                        f"{row['drain_vs_floor']}x the floor), "
                        f"expiry→takeover p95 {row['expiry_to_takeover_p95_s']} s, "
                        f"expiry→saga start p50 {row['expiry_to_start_p50_s']} s "
                        f"p95 {row['expiry_to_start_p95_s']} s max {row['expiry_to_start_max_s']} s, "
                        f"expiry→job start p95 {row['expiry_to_job_start_p95_s']} s, "
                        f"duplicates {row['duplicate_handler_calls']}, CPU ms/job {row['cpu_ms_per_job']}",
                        flush=True,
                    )
            saturation = (
                deployed_phases(n, url, server_pid, folder, env, args) if "saturated" in phases else []
            )
    for measured in (rows, scaling):
        for row in measured:
            row["speedup_vs_1"] = round(measured[0]["drain_s"] / row["drain_s"], 2)

    peer = agent_saga_peer(n, folder) if "quiet" in phases else {}
    if peer:
        print(f"  agent-saga RecoveryDaemon (1 process, in-process handlers, no network): {peer}")
    result = {
        "benchmark": "recovery",
        "quick": args.quick,
        "database": "postgresql",  # the only store it runs on (it needs DATABASE_URL)
        "sagas": n,
        "steps_per_saga": STEPS,
        "handler_ms": HANDLER_S * 1000,
        "lease_ttl_s": LEASE_TTL,
        "sweep_every_s": args.sweep_every,
        "worker_concurrency": args.concurrency,
        "ours": rows,
        "scaling_concurrency": args.scaling_concurrency,
        "scaling": scaling,
        "peer_agent_saga_daemon": peer,
        "saturated_phase": saturation,
        "saturated_note": (
            "one `sagaplane worker --concurrency C`, the deployment's own `celery worker -B "
            "--concurrency=2` (the beat's sweeper thread and the worker's claims take leases over; "
            "no sweep in this process): first quiet, then with a flood of ingest (4 agents x 20 "
            "sagas a request, tests/recovery/flood.py) keeping integration and sealing busy and two "
            "CPU hogs per core. expiry_to_start_p95_s is the p95 from lease expiry to the saga's "
            "first compensation claim; each row carries the load average before and during it"
        ),
        "targets": {
            "expiry_to_start_p95_s_below": TARGET_P95_S,
            "definition": (
                "p95 over sagas of (the saga's first compensation claim - its lease expiry), both by "
                "the server's clock: when recovery starts compensating each orphaned saga. The per-job "
                "p95 (every job's first claim - its saga's lease expiry) is reported beside it; it is "
                "bounded below by the drain time, since a saga's steps run strictly newest first"
            ),
            "p95_takeover_met": all(r["expiry_to_takeover_p95_s"] < TARGET_P95_S for r in rows),
            "p95_start_met_saturated": all(
                r["expiry_to_start_p95_s"] < TARGET_P95_S for r in saturation if r["phase"] == "saturated"
            ),
            "p95_start_met": all(r["expiry_to_start_p95_s"] < TARGET_P95_S for r in rows),
            "p95_start_met_by_workers": {
                str(r["workers"]): r["expiry_to_start_p95_s"] < TARGET_P95_S for r in rows
            },
            "p95_takeover_met_by_workers": {
                str(r["workers"]): r["expiry_to_takeover_p95_s"] < TARGET_P95_S for r in rows
            },
            "p95_job_start_met": all(r["expiry_to_job_start_p95_s"] < TARGET_P95_S for r in rows),
            "speedup_4_workers": rows[-1]["speedup_vs_1"] if rows else None,
            "speedup_4_workers_scaling": scaling[-1]["speedup_vs_1"] if scaling else None,
            "speedup_note": (
                "with many handlers per worker (ours) one worker already drives the control plane to "
                "its capacity on this machine, so more workers add little; the scaling series "
                "(one handler at a time per worker) measures how drain time scales with workers "
                "while the workers are the bottleneck"
            ),
            "zero_duplicates": all(r["duplicate_handler_calls"] == 0 for r in rows + scaling),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "setup": (
            "gunicorn controlplane.asgi:application -k uvicorn.workers.UvicornWorker --workers 2 "
            "(production settings, runtime role), own Redis; the sweep (recovery.sweep) every "
            f"{args.sweep_every:g} s in the benchmark's process; `sagaplane worker --concurrency "
            f"{args.concurrency}` processes claiming batches (max_jobs) from POST /api/v1/recovery/claim "
            "and reporting batches to POST /api/v1/recovery/results"
        ),
    }
    out = ROOT / "bench" / "results" / ("recovery-quick.json" if args.quick else "recovery.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
