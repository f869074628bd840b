"""The gate benchmark's `leases` part (issue 28): what a decision on a budget lease costs.

- `held_lease_decision`: a decision on a held lease, in process (`sagaplane.leases.LeaseHolder.
  decide` on a call the lease covers: the holder's lock, the scope check, the amount counted);
  the lease was granted by a stub that answers as the server does, so no round trip is timed.
- `partitioned_halt`: an agent whose control-plane traffic is dropped right after its last
  renewal (the worst moment for a halt engaged then): how long until it allows nothing (its
  lease's TTL, counted from when the grant was sent, less the margin).
- `cpu_per_decision`: control-plane CPU (this process' CPU clock, the stores' clients included,
  Redis' and Postgres' own CPU not) per decision on the per-call path (`evaluate`) against per
  decision served on leases (`grant_lease` + `give_back_lease`, each lease used whole), 64 agents'
  worth of calls, on the Redis store and Postgres.
- `overspend`: 64 agents as threads spending one cap on leases (per call once little is left);
  overspend is what they performed past the cap (0 unless the invariant broke).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

from sagaplane.client import Response, TransportError
from sagaplane.leases import LeaseHolder

from bench.support.gate_common import _pct, evaluate_scoped
from tenants.actors import system_actor

AGENTS = 64


class _StubServer:
    """Answers lease grants as the control plane does (a large grant), or drops every call."""

    def __init__(self, ttl_ms: int, granted: str = "1000000") -> None:
        self.ttl_ms, self.granted, self.partitioned = ttl_ms, granted, False

    def post(self, path: str, body: Any) -> Response:
        if self.partitioned:
            raise TransportError("partitioned")
        answer = {
            "decision": "lease",
            "lease_id": str(uuid.uuid4()),
            "ttl_ms": self.ttl_ms,
            "limits": [{"limit": "tokens", "argument": "amount", "granted": self.granted, "per_call": "1"}],
            "scope_args": [],
        }
        return Response(200, answer, {})


def held_lease_decision(decisions: int) -> dict[str, Any]:
    holder = LeaseHolder(_StubServer(ttl_ms=3_600_000))  # type: ignore[arg-type]
    args = {"amount": 1}
    assert holder.decide("s", "llm.complete", "a", args) is not None  # the grant, untimed
    samples: list[float] = []
    perf = time.perf_counter
    for _ in range(decisions):
        started = perf()
        answer = holder.decide("s", "llm.complete", "a", args)
        samples.append(perf() - started)
        assert answer is not None
    micro = [s * 1e6 for s in samples]
    return {
        "decisions": decisions,
        "p50_us": round(statistics.median(micro), 2),
        "p99_us": round(_pct(micro, 99), 2),
        "max_us": round(max(micro), 2),
    }


def partitioned_halt(trials: int, ttl_ms: int = 1000) -> dict[str, Any]:
    worst: list[float] = []
    for _ in range(trials):
        server = _StubServer(ttl_ms=ttl_ms)
        holder = LeaseHolder(server)  # type: ignore[arg-type]
        assert holder.decide("s", "t", "a", {"amount": 1}) is not None
        server.partitioned = True  # a halt engaged now never reaches this agent
        cut = time.monotonic()
        while holder.decide("s", "t", "a", {"amount": 1}) is not None:
            time.sleep(0.001)
        worst.append((time.monotonic() - cut) * 1000)
    return {
        "trials": trials,
        "ttl_ms": ttl_ms,
        "max_ms": round(max(worst), 1),
        "p50_ms": round(statistics.median(worst), 1),
    }


def cpu_per_decision(services: Any, tenant: Any, store: Any, decisions: int) -> dict[str, Any]:
    from fleet.gate import GateRequest
    from tests.support.scoping import in_tenant  # a lease service as its view calls it

    def request(n: int) -> GateRequest:
        return GateRequest(
            saga_id=f"cpu-{uuid.uuid4()}", step_id=str(n), tool="llm.complete", args={"amount": 1}
        )

    started = time.process_time()
    for n in range(decisions):
        assert (
            evaluate_scoped(tenant, request(n), actor=system_actor("bench"), store=store)["decision"]
            == "allow"
        )
    per_call_ms = (time.process_time() - started) * 1000 / decisions
    served, grants = 0, 0
    started = time.process_time()
    while served < decisions * 4:
        answer = in_tenant(
            services.grant_lease,
            tenant,
            request(0),
            calls=256,
            lease_id=uuid.uuid4(),
            actor=system_actor("bench"),
            store=store,
        )
        assert answer["decision"] == "lease", answer
        granted = int(float(answer["limits"][0]["granted"]))
        in_tenant(
            services.give_back_lease,
            tenant,
            uuid.UUID(answer["lease_id"]),
            {"tokens": granted},
            actor=system_actor("bench"),
            store=store,
        )
        served, grants = served + granted, grants + 1
    lease_ms = (time.process_time() - started) * 1000 / served
    return {
        "per_call_cpu_ms_per_decision": round(per_call_ms, 4),
        "lease_cpu_ms_per_decision": round(lease_ms, 5),
        "decisions_per_lease": round(served / grants, 1),
        "ratio": round(per_call_ms / lease_ms, 1) if lease_ms else None,
    }


def overspend(services: Any, tenant: Any, store: Any, cap: int) -> dict[str, Any]:
    from fleet.gate import GateRequest
    from tests.support.scoping import in_tenant  # a lease service as its view calls it

    performed = [0] * AGENTS
    failures = [0]
    lock = threading.Lock()

    def agent(n: int) -> None:
        from django.db import connection

        try:
            _spend(n)
        finally:
            connection.close()

    def _spend(n: int) -> None:
        refusals, errors = 0, 0
        while refusals < 3 and errors < 100:
            try:
                refusals = _turn(n, refusals)
            except Exception:  # a pooled connection not had in time (64 threads): asked again
                errors += 1
                with lock:
                    failures[0] += 1

    def _turn(n: int, refusals: int) -> int:
        request = GateRequest(
            saga_id=f"o-{n}", step_id=str(uuid.uuid4()), tool="cap.spend", args={"amount": 1}
        )
        answer = in_tenant(
            services.grant_lease,
            tenant,
            request,
            calls=8,
            lease_id=uuid.uuid4(),
            actor=system_actor("bench"),
            store=store,
        )
        if answer["decision"] == "lease":
            granted = int(float(answer["limits"][0]["granted"]))
            with lock:
                performed[n] += granted
            lease_id = uuid.UUID(answer["lease_id"])
            in_tenant(
                services.give_back_lease,
                tenant,
                lease_id,
                {"capped": granted},
                actor=system_actor("bench"),
                store=store,
            )
            return 0
        decided = evaluate_scoped(tenant, request, actor=system_actor("bench"), store=store)
        if decided["decision"] == "allow":
            with lock:
                performed[n] += 1
            return 0
        return refusals + 1

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(AGENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = sum(performed)
    return {
        "agents": AGENTS,
        "cap": cap,
        "performed": total,
        "overspend": max(0, total - cap),
        "calls_failed_and_asked_again": failures[0],
    }


def measure(services: Any, quick: bool) -> dict[str, Any]:
    """The `leases` object of bench/results/gate.json, on the configured store (Redis) and Postgres."""
    from core.scoping import tenant_context
    from tenants import founding

    slug = f"leases-{uuid.uuid4().hex[:10]}"
    tenant = founding.create_tenant(slug, "Lease bench", f"owner@{slug}.example", actor=system_actor("bench"))
    day = 86_400
    cap = 500 if quick else 5_000
    with tenant_context(tenant):  # the fleet's services assert the tenant's scope
        services.create_budget(
            tenant,
            services.BudgetCreate.parse(
                {"name": "tokens", "tool": "llm.*", "max_total": 10**9, "window_s": day}
            ),
            actor=system_actor("bench"),
        )
        services.create_budget(
            tenant,
            services.BudgetCreate.parse(
                {"name": "capped", "tool": "cap.*", "max_total": cap, "window_s": day}
            ),
            actor=system_actor("bench"),
        )
    store = services.get_store()
    decision = held_lease_decision(20_000 if quick else 200_000)
    halt = partitioned_halt(2 if quick else 5)
    cpu = cpu_per_decision(services, tenant, store, 100 if quick else 1_000)
    spent = overspend(services, tenant, store, cap)
    return {
        "decision_p99_us": decision["p99_us"],
        "overspend": spent["overspend"],
        "server_cpu_ratio_vs_per_call": cpu["ratio"],
        "halt_partitioned_ms": halt["max_ms"],
        "held_lease_decision": decision,
        "control_plane_cpu": cpu,
        "overspend_run": spent,
        "halt_partitioned": halt,
        "notes": "decision: LeaseHolder.decide on a held lease (a stub granted it; no round trip); CPU: "
        "this process' CPU clock, the stores' clients included, not Redis' or Postgres' own; "
        "overspend: 64 agents as threads spending one cap on leases, per call once little is left",
    }
