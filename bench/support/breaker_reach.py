"""Breaker open → first fleet-wide refusal (issue 27's speed target: p95 ≤ 1 s), a part of the
gate benchmark (bench/gate.py runs it against its production server).

A tenant with a breaker on `bench.*` that opens at the first failure; an SDK `Gate` in another
process watches `bench.charge` (ungoverned while closed: decided locally from the long-polled
fleet status, no request per check). Each trial ships one `STEP_FAILED` over HTTP (the real ingest:
its after-commit counter opens the breaker) and times from just before the ship until the watcher
refuses `circuit_open`; then the breaker is deleted and created again (closed), and the watcher is
waited for until it allows again. The machine's 1-minute load average is recorded beside the figure.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from bench.support.gate_common import _pct
from bench.support.gate_http import reach_ms
from tenants.actors import system_actor

SETTINGS = {
    "name": "bench down",
    "tool": "bench.*",
    "consecutive_failures": 1,
    "failure_rate": 1,
    "min_volume": 1,
    "window_s": 60,
    "cool_down_s": 3600,
}


def breaker_reach(url: str, trials: int) -> dict[str, Any]:
    """Time from shipping the failure that opens a breaker to an SDK in another process refusing."""
    import httpx
    from sagaplane.chain import GENESIS, stamp

    from core.scoping import tenant_context
    from fleet import services
    from tenants import founding
    from tenants import services as tenant_services

    slug = f"breaker-{uuid.uuid4().hex[:10]}"
    tenant = founding.create_tenant(
        slug, "Breaker bench", f"owner@{slug}.example", actor=system_actor("bench")
    )
    with tenant_context(tenant):  # the tenant's and the breaker's services assert the tenant's scope
        _, key = tenant_services.create_api_key(
            tenant,
            tenant_services.NewApiKey(name="agent", scopes=["gate", "ingest"]),
            actor=system_actor("bench"),
        )
        breaker = services.create_breaker(
            tenant, services.BreakerCreate.parse(SETTINGS), actor=system_actor("bench")
        )
    agent = httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {key}", "X-Forwarded-Proto": "https"}, timeout=30
    )
    chain = {"head": GENESIS, "seq": 0}
    load_before = os.getloadavg()[0]

    def fail(trial: int) -> float:
        records = []
        for event in ("STEP_INTENT", "STEP_FAILED"):
            chain["seq"] += 1
            record = {"seq": chain["seq"], "ts": time.time(), "event": event, "saga_id": f"b{trial}"}
            record.update(step_id="1", tool="bench.charge")
            chain["head"] = stamp(record, chain["head"])
            records.append(record)
        shipped = time.time()
        response = agent.post("/api/v1/streams/bench-agent/records", json={"records": records})
        assert response.status_code == 200, response.text
        return shipped

    def close() -> None:
        nonlocal breaker
        with tenant_context(tenant):
            services.delete_breaker(tenant, breaker.pk, actor=system_actor("bench"))
            breaker = services.create_breaker(
                tenant, services.BreakerCreate.parse(SETTINGS), actor=system_actor("bench")
            )

    try:
        ms = reach_ms(url, key, "circuit_open", trials, trigger=fail, reset=close, what="an open breaker")
    finally:
        agent.close()
    return {
        "trials": trials,
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(_pct(ms, 95), 1),
        "max_ms": round(max(ms), 1),
        "all_ms": [round(x, 1) for x in ms],
        "target_p95_ms": 1000,
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
