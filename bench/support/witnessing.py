"""The witnesses' part of bench/transparency.py (issue 26), in the same run:

* signed -> witnessed: under the sustained phase's ingesting clients, two real `sagaplane witness
  serve` processes (quorum 2) cosign the tenant's log; a loop here plays the Celery worker that
  takes the integrator's cosigning request (`cosign_tenant`, as in production). For each
  checkpoint signed, the time until a checkpoint at least as large carries both cosignatures;
* a witness's add-checkpoint/s with consistency proofs (one client, and four), against the same
  server's trivial monitoring GET as the peer;
* tlog-proof verification/s under a quorum-2 policy, against the same file checked with the log
  key only as the peer.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tenants.actors import system_actor

ROOT = Path(__file__).resolve().parents[2]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def _start_witnesses(tenant: Any, folder: Path) -> list[Any]:
    from core.scoping import tenant_context
    from tests.sdk.witnesskit import start_witness
    from transparency import keys, services, witnesses

    with tenant_context(tenant):
        vkey = services.current_verifier_keys()[0]
    origin = keys.log_origin(tenant)
    running = [start_witness(folder / f"w{i}", f"bench.witness/w{i}", [(origin, vkey)]) for i in (1, 2)]
    with tenant_context(tenant):
        for i, w in enumerate(running, start=1):
            new = witnesses.WitnessAdd.parse({"name": f"w{i}", "url": w.url, "vkey": w.vkey})
            witnesses.add_witness(tenant, new, actor=system_actor("bench"))
        witnesses.set_quorum(tenant, witnesses.Quorum(2), actor=system_actor("bench"))
    return running


def _witnessed_lags(tenant: Any, since_id: int) -> tuple[list[float], int]:
    from core.scoping import tenant_context
    from transparency.models import Checkpoint, Cosignature

    with tenant_context(tenant):
        signed = list(
            Checkpoint.objects.filter(id__gt=since_id).order_by("id").values_list("id", "size", "created_at")
        )
        done: dict[int, list[Any]] = {}
        for checkpoint_id, created in Cosignature.objects.filter(checkpoint_id__gt=since_id).values_list(
            "checkpoint_id", "created_at"
        ):
            done.setdefault(checkpoint_id, []).append(created)
    # (size, time the quorum was reached) for each checkpoint both witnesses cosigned.
    witnessed = sorted((size, sorted(done[cid])[1]) for cid, size, _ in signed if len(done.get(cid, [])) >= 2)
    lags = []
    for _, size, created in signed:
        reached = [at for wsize, at in witnessed if wsize >= size]
        if reached:
            lags.append(max(0.0, (min(reached) - created).total_seconds()))
    return lags, len(signed)


def signed_to_witnessed(tenant: Any, run_sustained: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run the sustained phase with two witnesses cosigning beside it; the lag of each checkpoint."""
    from core.scoping import tenant_context
    from transparency import tasks
    from transparency.models import Checkpoint

    folder = Path(tempfile.mkdtemp(prefix="sagaplane-bench-witness-"))
    running = _start_witnesses(tenant, folder)
    tasks.request_cosigning = _flag(tasks.COSIGN)
    with tenant_context(tenant):
        since = Checkpoint.objects.order_by("-id").values_list("id", flat=True).first() or 0
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    stop, ready, reports = context.Event(), context.Event(), context.Queue()
    # The Celery worker that takes the integrator's cosigning request: a process of its own, as
    # production's workers are (not a thread here, where it would share the integrator's GIL).
    worker = context.Process(target=_cosigner_process, args=(tenant.pk, stop, ready, reports))
    worker.start()
    ready.wait(timeout=120)  # django set up and one pass made: the phase starts with a warm worker
    try:
        sustained = run_sustained()
    finally:
        stop.set()
        passes = reports.get(timeout=120)
        worker.join(timeout=60)
    lags, signed = _witnessed_lags(tenant, since)
    result = {
        "witnesses": 2,
        "quorum": 2,
        "checkpoints_signed": signed,
        "checkpoints_witnessed_within_run": len(lags),
        "cosigning_passes": passes,
        "signed_to_quorum_ms": {"p50": _pct(lags, 0.5), "p95": _pct(lags, 0.95), "max": _pct(lags, 1.0)}
        if lags
        else None,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "note": "for each checkpoint signed during the sustained phase: its created_at -> the second "
        "cosignature stored on a checkpoint at least as large (a pass sends only the latest)",
    }
    return {"sustained_ingest": sustained, "witnessed": result, "running": running}


def _cosigner_process(tenant_id: int, stop: Any, ready: Any, reports: Any) -> None:
    """Run `cosign_tenant` whenever cosigning is requested (the flag the integrator raises after
    each checkpoint) or, every 0.1 s, the database says a witness is behind (embedded mode's cache
    is per process); after `stop`, until no witness is behind (30 s at most)."""
    import django

    django.setup()
    from transparency import cross_tenant, tasks

    tasks.request_cosigning = _flag(tasks.COSIGN)
    tasks.cosign_tenant(tenant_id)  # warm: imports, connections, the witnesses' first cosignature
    ready.set()
    passes, last_look, deadline = 0, 0.0, None
    while True:
        now = time.monotonic()
        due = tasks._requested(tenant_id, tasks.COSIGN)
        if not due and now - last_look > 0.1:
            last_look = now
            due = tenant_id in cross_tenant.tenants_to_cosign()
        if due:
            tasks.cosign_tenant(tenant_id)
            passes += 1
            continue
        if stop.is_set():
            deadline = deadline or now + 30
            if now > deadline or tenant_id not in cross_tenant.tenants_to_cosign():
                break
        time.sleep(0.005)
    reports.put(passes)


def _flag(kind: str) -> Any:
    from django.core.cache import cache

    from transparency import tasks

    return lambda tenant_id: bool(
        cache.add(tasks._request_key(tenant_id, kind), "1", timeout=tasks.INTEGRATION_REQUEST_TTL)
    )


def add_checkpoint_rate(quick: bool) -> dict[str, Any]:
    """A witness's add-checkpoint/s: each request grows a fresh log by one leaf, with its proof."""
    import hashlib
    import http.client
    import urllib.parse

    from tests.sdk.witnesskit import FakeLog, start_witness

    folder = Path(tempfile.mkdtemp(prefix="sagaplane-bench-witness-rate-"))
    logs = [FakeLog(f"bench.log/{i}") for i in range(4)]
    witness = start_witness(folder / "w", "bench.witness/rate", [(log.origin, log.vkey) for log in logs])
    count = 200 if quick else 2_000
    try:
        for log in logs:
            log.grow(1000)
            status = witness.post(log.request(0))[0]
            assert status == 200, status

        def run(log: FakeLog, n: int) -> None:
            parts = urllib.parse.urlsplit(witness.url)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)  # keep-alive
            for _ in range(n):
                old = log.tree.size
                log.grow(1)
                conn.request("POST", "/add-checkpoint", body=log.request(old).encode())
                response = conn.getresponse()
                response.read()
                assert response.status == 200, response.status
            conn.close()

        start = time.perf_counter()
        run(logs[0], count)
        one = count / (time.perf_counter() - start)
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda log: run(log, count // 4), logs))
        four = (count // 4 * 4) / (time.perf_counter() - start)
        # The peer: the same server answering its trivial monitoring read.
        parts = urllib.parse.urlsplit(witness.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        path = f"/{hashlib.sha256(logs[0].origin.encode()).hexdigest()}/checkpoint"
        start = time.perf_counter()
        for _ in range(count):
            conn.request("GET", path)
            conn.getresponse().read()
        reads = count / (time.perf_counter() - start)
        conn.close()
    finally:
        witness.stop()
    return {
        "requests": count,
        "add_checkpoint_per_s_one_client": round(one),
        "add_checkpoint_per_s_four_clients": round(four),
        "monitoring_get_per_s_same_server": round(reads),
        "ratio_add_checkpoint_over_get": round(one / reads, 3),
        "signatures_per_answer": len(witness.vkeys),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "note": "each request: one leaf more, its consistency proof from the last cosigned size, the "
        "log's signature checked, state committed (synchronous=FULL) and cosigned with every key",
    }


def proof_verification_rate(tenant: Any, quick: bool, policy_dir: Path) -> dict[str, Any]:
    """tlog-proof bundles verified per second under the tenant's quorum-2 policy (the record from
    the extra data, inclusion, the log's signature, both cosignatures), against the log key alone."""
    from sagaplane import tlogproof
    from sagaplane.policy import parse_policy

    from core.scoping import tenant_context
    from transparency import proofs, witnesses

    with tenant_context(tenant):
        witnessed = witnesses.witnessed_checkpoint()
        assert witnessed is not None and witnessed.size > 0, "no checkpoint the quorum cosigned"
        bundle = proofs.proof_file(tenant, witnessed.size - 1)
        policy_text = witnesses.policy_text(tenant)
    policy = parse_policy(policy_text)
    (policy_dir / "bench.policy").write_text(policy_text)
    log_keys = [log.encode() for log in policy.logs]
    count = 300 if quick else 3_000

    def full() -> None:
        tlogproof.verify_proof(bundle, log_keys)
        policy.check(tlogproof.parse_proof(bundle).checkpoint)

    def key_only() -> None:
        tlogproof.verify_proof(bundle, log_keys)

    rates = {}
    for name, fn in (("policy", full), ("key_only", key_only)):
        start = time.perf_counter()
        for _ in range(count):
            fn()
        rates[name] = count / (time.perf_counter() - start)
    return {
        "verifications": count,
        "tlog_proof_verifications_per_s_policy": round(rates["policy"]),
        "tlog_proof_verifications_per_s_log_key_only": round(rates["key_only"]),
        "ratio_policy_over_key_only": round(rates["policy"] / rates["key_only"], 3),
        "cosignatures_checked": 2,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
