"""bench/transparency.py's sustained phase: integration and sealing under sustained ingest, the
agents and the sealer each in a process of their own, the integrator in the benchmark's."""

from __future__ import annotations

import os
import time
from typing import Any

from tenants.actors import system_actor


def pct_ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # ms


def _saga_records(first_seq: int, count: int, stream: str) -> list[dict[str, Any]]:
    """Unchained records shaped like an agent's sagas: start, four steps, complete (so the seal
    pass has work: one seal per six records)."""
    out = []
    for seq in range(first_seq, first_seq + count):
        phase, saga = (seq - 1) % 6, f"{stream}-{(seq - 1) // 6}"
        event = "SAGA_START" if phase == 0 else "SAGA_COMPLETE" if phase == 5 else "STEP_COMMITTED"
        out.append(
            {"seq": seq, "ts": 1700000000.0 + seq, "event": event, "saga_id": saga, "step_id": f"s{seq}"}
        )
    return out


def _sustained_client(
    tenant_id: int, n: int, run: int, batches: int, size: int, reports: Any, start: Any
) -> None:
    """One agent process: ships `batches` chained batches to its own stream as fast as it can and
    reports (commit time, last leaf index, the sagas the batch finished) for each."""
    import django

    django.setup()  # a spawned process: nothing (connections, cache clients) shared with the parent
    from sagaplane.chain import GENESIS, stamp

    from audit import services as audit_services
    from core.scoping import tenant_context
    from tenants.models import Tenant

    tenant = Tenant.objects.get(pk=tenant_id)
    head, seq = GENESIS, 1
    start.wait()  # every client set up: the clock starts
    for _ in range(batches):
        batch = _saga_records(seq, size, f"c{n}")
        seq += size
        for record in batch:
            head = stamp(record, head, salt="00" * 16)
        with tenant_context(tenant):  # as the ingest view enters it
            result = audit_services.ingest(tenant, f"sustained-{n}-{run}", batch, actor=system_actor("bench"))
        finished = [r["saga_id"] for r in batch if r["event"] == "SAGA_COMPLETE"]
        reports.put((time.time(), result.rows[-1].leaf_index, finished))
    reports.put(None)


def _flag_only(kind: str) -> Any:
    """A request that only raises its flag in the cache (no broker message): in the benchmark the
    loops below are the workers, and the flag is what they watch."""
    from django.core.cache import cache

    from transparency import tasks

    return lambda tenant_id: bool(
        cache.add(tasks._request_key(tenant_id, kind), "1", timeout=tasks.INTEGRATION_REQUEST_TTL)
    )


def _sustained_sealer(tenant_id: int, reports: Any, start: Any, ingest_done: Any) -> None:
    """The sealer's worker, in a process of its own beside the integrator (as production runs two
    Celery workers): `seal_tenant` whenever sealing is requested or the log has grown past the
    seal watermark, until ingest is done and everything is sealed. Reports ("sealer", stats) with
    its busy time, seals, phases and each sealed saga's seal commit time."""
    import django

    django.setup()
    from core import timing
    from core.scoping import tenant_context
    from tenants.models import Tenant
    from transparency import services, sources, tasks
    from transparency.models import SealState

    tasks.request_integration = _flag_only(tasks.INTEGRATE)
    tasks.request_sealing = _flag_only(tasks.SEAL)
    tenant = Tenant.objects.get(pk=tenant_id)
    sealed_at: dict[str, float] = {}
    real_pass = services.seal_pass

    def timed_pass(tenant: Any, **kwargs: Any) -> tuple[list[str], bool]:
        sealed, sealed_up = real_pass(tenant, **kwargs)
        now = time.time()  # the pass has committed (one transaction, closed on return)
        for saga_id in sealed:
            sealed_at.setdefault(saga_id, now)  # its first seal
        return sealed, sealed_up

    services.seal_pass = timed_pass

    def behind() -> bool:
        if tasks._requested(tenant_id, tasks.SEAL):
            return True
        with tenant_context(tenant):
            watermark = SealState.objects.values_list("sealed_size", flat=True).first() or 0
            return sources.log_size(tenant) > watermark

    busy, calls, seals = 0.0, 0, 0
    phases: dict[str, float] = {}
    start.wait()
    while True:
        done = ingest_done.is_set()  # read before the check: a batch after it is seen next round
        if behind():
            t0 = time.perf_counter()
            with timing.collecting() as marked:
                seals += tasks.seal_tenant(tenant_id)
            busy += time.perf_counter() - t0
            calls += 1
            for name, seconds in marked.items():
                phases[name] = phases.get(name, 0.0) + seconds
        elif done:
            break
        else:
            ingest_done.wait(0.005)
    reports.put(
        ("sealer", {"busy": busy, "calls": calls, "seals": seals, "phases": phases, "sealed_at": sealed_at})
    )


def _lag_ms(lags: list[float]) -> dict[str, float]:
    return {
        "p50": round(pct_ms(lags, 0.5), 1),
        "p95": round(pct_ms(lags, 0.95), 1),
        "max": round(max(lags) * 1000, 1),
    }


def sustained_phase(tenant: Any, clients: int, batches: int, size: int) -> dict[str, Any]:
    """Integration and sealing under sustained ingest: `clients` processes ingest saga-shaped
    batches while the sealer (its own process) seals the sagas they finish and the integrator
    (this process) integrates records and seals and signs, each coalesced as in production (the
    ingest hook's request, and the sealer's request for its seals' signing, are all they are told).
    Reports ingest records/s and saga completions/s, the integrator's leaves/s and the sealer's
    seals/s of busy time, how long each batch waited for a checkpoint and each saga for its seal."""
    import multiprocessing

    from core import timing
    from core.scoping import tenant_context
    from transparency import sources, tasks
    from transparency.models import Checkpoint

    tasks.request_integration = _flag_only(tasks.INTEGRATE)
    tasks.request_sealing = _flag_only(tasks.SEAL)
    tasks.seal_tenant(tenant.pk)
    tasks.integrate_tenant(tenant.pk)
    with tenant_context(tenant):
        start_size = Checkpoint.objects.order_by("-id").values_list("size", flat=True).first() or 0
    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    start = context.Barrier(clients + 2)
    ingest_done = context.Event()
    procs = [
        # Streams of this run's own: a reused tenant (--tenant) holds earlier runs' streams.
        context.Process(
            target=_sustained_client, args=(tenant.pk, n, int(time.time()), batches, size, reports, start)
        )
        for n in range(clients)
    ]
    sealer = context.Process(target=_sustained_sealer, args=(tenant.pk, reports, start, ingest_done))
    passes = 0
    phases: dict[str, float] = {}  # where the integrator's time went (core.timing marks)
    commits: list[tuple[float, int, list[str]]] = []
    sealer_stats: dict[str, Any] | None = None
    busy = 0.0
    for proc in [*procs, sealer]:
        proc.start()
    start.wait()
    started = time.time()

    def behind() -> bool:
        # The request flag, or (no shared cache: embedded mode's is per process) the log itself.
        if tasks._requested(tenant.pk):
            return True
        with tenant_context(tenant):
            return sources.log_size(tenant) > tasks._integrated_size(tenant)

    running = clients
    while running or sealer_stats is None or behind():
        while True:
            try:
                item = reports.get(timeout=0.005)
            except Exception:
                break
            if item is None:
                running -= 1
                if not running:
                    ingest_done.set()
            elif item[0] == "sealer":
                sealer_stats = item[1]
            else:
                commits.append(item)
        if behind():
            t0 = time.perf_counter()
            with timing.collecting() as marked:
                tasks.integrate_tenant(tenant.pk)
            busy += time.perf_counter() - t0
            passes += 1
            for name, seconds in marked.items():
                phases[name] = phases.get(name, 0.0) + seconds
    ingest_end = max(when for when, _, _ in commits)
    for proc in [*procs, sealer]:
        proc.join()
    # Leaves = the agents' records plus the seals the sealer appended and the integrator signed.
    with tenant_context(tenant):
        end_size = Checkpoint.objects.order_by("-id").values_list("size", flat=True).first() or 0
        signed = [
            (created.timestamp(), size)
            for created, size in Checkpoint.objects.filter(size__gt=start_size)
            .order_by("id")
            .values_list("created_at", "size")
        ]
    lags, seal_lags = [], []
    sealed_at: dict[str, float] = sealer_stats["sealed_at"]
    for committed_at, leaf, finished in commits:
        # The checkpoint row is written just before its transaction commits: a lower bound by
        # the commit's duration, a few milliseconds.
        covered = next((when for when, size in signed if size > leaf), None)
        assert covered is not None, "a batch was never covered by a checkpoint"
        lags.append(max(0.0, covered - committed_at))
        for saga_id in finished:
            assert saga_id in sealed_at, f"saga {saga_id} was never sealed"
            seal_lags.append(max(0.0, sealed_at[saga_id] - committed_at))
    records = clients * batches * size
    elapsed = ingest_end - started
    ingest_rps = records / elapsed
    completions_ps = len(seal_lags) / elapsed
    integration_lps = (end_size - start_size) / busy
    sealer_busy = sealer_stats["busy"]
    seals_ps = sealer_stats["seals"] / sealer_busy if sealer_busy else 0.0
    wall = time.time() - started
    return {
        "clients": clients,
        "batches_per_client": batches,
        "batch_size": size,
        "records": records,
        "leaves_signed": end_size - start_size,
        "ingest_records_per_s": round(ingest_rps),
        "saga_completions_per_s": round(completions_ps),
        "integration_leaves_per_s_busy": round(integration_lps),
        "integrator_busy_fraction": round(busy / wall, 3),
        "integrator_calls": passes,
        "checkpoints_signed": len(signed),
        "ratio_integration_to_ingest": round(integration_lps / ingest_rps, 2),
        "sealer_seals": sealer_stats["seals"],
        "sealer_seals_per_s_busy": round(seals_ps),
        "sealer_busy_fraction": round(sealer_busy / wall, 3),
        "sealer_calls": sealer_stats["calls"],
        "ratio_sealing_to_completions": round(seals_ps / completions_ps, 2) if completions_ps else None,
        "checkpoint_lag_ms": _lag_ms(lags),
        "seal_lag_ms": _lag_ms(seal_lags),
        # Integrator, per pass: integrate (per round: read_leaves, compute_nodes, consistency,
        # write_nodes, sign; the rest is locking and commit). Sealer, per pass: seal_pass
        # (seal_find, seal_read, seal_compute, seal_append, which holds the append's own
        # rows/insert_payloads/projection_*/log_lock/insert_locked). Nested phases overlap their
        # parents; shares are of each process's busy time.
        "integrator_phases_share": {name: round(seconds / busy, 3) for name, seconds in phases.items()},
        "sealer_phases_share": {
            name: round(seconds / sealer_busy, 3) for name, seconds in sealer_stats["phases"].items()
        }
        if sealer_busy
        else {},
        "load_average_1m": round(os.getloadavg()[0], 2),
        "note": "ingest in separate processes, sealer in one, integrator (integrate, sign) in another, "
        "each coalesced; lag = batch commit -> first signed checkpoint covering its last leaf; "
        "seal lag = commit of the batch with a saga's terminal record -> commit of its seal",
    }
