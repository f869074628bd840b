"""The gate benchmark's floors and peers (bare round trips, agent-saga's store), and ours in process
(the store alone, the whole decision, its SQL statements and its profile)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from types import SimpleNamespace
from typing import Any

from bench.support.gate_common import (  # noqa: E402
    AMOUNT,
    HUGE_CAP,
    WINDOW_S,
    Run,
    _call_args,
    _overspend_check,
    _summary,
    _threads,
    evaluate_scoped,
    perf,
)
from tenants.actors import system_actor

# ------------------------------------------------------------------------------------------- peers


def evalsha_floor(redis_url: str, clients: int, total: int) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(redis_url, max_connections=clients + 4)
    trivial = client.register_script("return 1")
    trivial()  # loads the script: every timed call is an EVALSHA
    latencies, _, wall = _threads(clients, total // clients, lambda n, i: trivial() == 1)
    client.close()
    return {"clients": clients, **_summary(latencies, wall)}


def postgres_floor(db_url: str, total: int) -> dict[str, Any]:
    """One bare `SELECT 1` round-trip to the benchmark's Postgres database (1 client): what each of
    a decision's SQL statements costs at least."""
    import psycopg

    with psycopg.connect(db_url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute("SELECT 1")
        latencies, _, wall = _threads(1, total, lambda n, i: conn.execute("SELECT 1").fetchone() == (1,))
    return {"clients": 1, **_summary(latencies, wall)}


_COMMIT_FLOOR_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_commit_floor (id bigserial PRIMARY KEY, at timestamptz)"
)


def durable_commit_floor(owner_url: str, total: int) -> dict[str, Any]:
    """One bare one-row `INSERT` that commits (autocommit, `synchronous_commit` as configured) into
    a logged table of the benchmark's database (1 client): what writing the ledger row durably
    before an allow costs at least -- the WAL flush (fsync) the commit waits for."""
    import psycopg

    with psycopg.connect(owner_url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(_COMMIT_FLOOR_TABLE)
        conn.execute("TRUNCATE bench_commit_floor")
        sync = conn.execute("SHOW synchronous_commit").fetchone()
        method = conn.execute("SHOW wal_sync_method").fetchone()
        latencies, _, wall = _threads(
            1,
            total,
            lambda n, i: conn.execute("INSERT INTO bench_commit_floor (at) VALUES (now())").rowcount == 1,
        )
    return {
        "clients": 1,
        "synchronous_commit": sync[0] if sync else "",
        "wal_sync_method": method[0] if method else "",
        **_summary(latencies, wall),
    }


def agent_saga_peer(redis_url: str, limits: int, clients: int, total: int) -> dict[str, Any]:
    """agent-saga's RedisLimitStore (asyncio, its native API) on the same limits and calls."""
    from agent_saga import limits as as_limits

    cap = AMOUNT * (total // 2)
    policy: list[Any] = []
    if limits == 5:
        policy += [
            as_limits.BudgetLimit(
                "per-currency",
                window=WINDOW_S,
                arg="amount",
                max_total=HUGE_CAP,
                scope=as_limits.by_arg("currency"),
            ),
            as_limits.BudgetLimit(
                "per-agent",
                window=WINDOW_S,
                arg="amount",
                max_total=HUGE_CAP,
                scope=lambda ctx: f"agent={ctx.agent}",
            ),
        ]
    policy.append(as_limits.BudgetLimit("fleet", window=WINDOW_S, arg="amount", max_total=cap))
    if limits == 5:
        policy += [
            as_limits.RateLimit("calls", window=WINDOW_S, max_calls=HUGE_CAP),
            as_limits.RateLimit(
                "per-tool-calls", window=WINDOW_S, max_calls=HUGE_CAP, scope=as_limits.by_tool
            ),
        ]
    store = as_limits.RedisLimitStore(redis_url, key_prefix=f"agent-saga:limit:{uuid.uuid4().hex[:8]}:")
    per_client = total // clients

    async def run() -> tuple[list[float], int, float]:
        latencies: list[float] = []
        allowed = 0
        await store.health_check()

        async def client(n: int) -> None:
            nonlocal allowed
            ctx = SimpleNamespace(tool="bench.charge", kwargs=_call_args(n), agent=f"agent-{n % 4}")
            for _ in range(per_client):
                t0 = perf()
                outcome = await store.reserve([req for _, req in as_limits.plan(policy, ctx)])
                latencies.append(perf() - t0)
                if isinstance(outcome, as_limits.Reservation):
                    allowed += 1

        t0 = perf()
        await asyncio.gather(*(client(n) for n in range(clients)))
        wall = perf() - t0
        await store.close()
        return latencies, allowed, wall

    latencies, allowed, wall = asyncio.run(run())
    total = per_client * clients
    return {
        "clients": clients,
        "limits": limits,
        **_summary(latencies, wall),
        "budget": _overspend_check(allowed, total, cap),
        "log_entries_per_key_at_end": allowed,
    }


# ---------------------------------------------------------------------------------------- in-process


def store_only(redis_url: str, limits: int, clients: int, total: int) -> dict[str, Any]:
    """Our RedisStore alone (the debits computed per call, as evaluate does), no database."""
    import redis

    from fleet import gate
    from fleet.stores import RedisStore, marker_key

    cap = AMOUNT * (total // 2)
    tenant_id = 10**9 + int(uuid.uuid4().int % 10**8)  # a counter namespace no tenant uses
    specs: list[gate.LimitSpec] = []
    if limits == 5:
        specs += [
            gate.LimitSpec(
                1,
                "budget",
                "per-currency",
                "bench.*",
                ("arg:currency",),
                WINDOW_S,
                HUGE_CAP * gate.SCALE,
                "amount",
            ),
            gate.LimitSpec(
                2, "budget", "per-agent", "bench.*", ("agent",), WINDOW_S, HUGE_CAP * gate.SCALE, "amount"
            ),
        ]
    specs.append(gate.LimitSpec(3, "budget", "fleet", "bench.*", (), WINDOW_S, cap * gate.SCALE, "amount"))
    if limits == 5:
        specs += [
            gate.LimitSpec(4, "rate", "calls", "bench.*", (), WINDOW_S, HUGE_CAP),
            gate.LimitSpec(5, "rate", "per-tool-calls", "bench.*", ("tool",), WINDOW_S, HUGE_CAP),
        ]
    client = redis.Redis.from_url(redis_url, max_connections=clients + 4, socket_timeout=2)
    client.set(marker_key(f"t{tenant_id}"), "1")  # a namespace with no ledger: nothing to rebuild
    store = RedisStore(client, lambda tenant, since: [])

    def work(n: int, i: int) -> bool:
        request = gate.GateRequest(
            saga_id=f"s-{n}-{i}", step_id="1", tool="bench.charge", args=_call_args(n), agent=f"agent-{n % 4}"
        )
        debits = gate.debits_for(specs, request, tenant_tag=f"t{tenant_id}")
        return store.check_and_debit(
            tenant_id, debits, idempotency_key=request.idempotency_key, decision_id=str(uuid.uuid4())
        ).allowed

    per_client = total // clients
    latencies, allowed, wall = _threads(clients, per_client, work)
    client.close()
    return {
        "clients": clients,
        "limits": limits,
        **_summary(latencies, wall),
        "budget": _overspend_check(allowed, per_client * clients, cap),
    }


def _warm_redis_marker(tenant: Any) -> None:
    """A new tenant has no ledger and nothing in flight, so its rebuilt Redis state is empty: set
    the ready marker directly (a cold tenant's first call otherwise rebuilds behind the
    REBUILD_FENCE_MS fence, once per tenant, a wait no later call pays)."""
    from fleet import services
    from fleet.stores import marker_key

    services.get_store().client.set(marker_key(services.gate_tag(tenant)), "1")  # type: ignore[attr-defined]


def in_process(store_name: str, limits: int, clients: int, total: int) -> dict[str, Any]:
    from django.db import connection

    from fleet import services
    from fleet.gate import GateRequest
    from fleet.stores import DatabaseStore

    run = Run(limits, total)
    store = services.get_store() if store_name == "redis" else DatabaseStore()
    if store_name == "redis":
        _warm_redis_marker(run.tenant)
    prefix = uuid.uuid4().hex[:8]

    def work(n: int, i: int) -> bool:
        request = GateRequest(
            saga_id=f"{prefix}-{n}-{i}",
            step_id="1",
            tool="bench.charge",
            args=_call_args(n),
            agent=f"agent-{n % 4}",
        )
        return (
            evaluate_scoped(run.tenant, request, actor=system_actor("bench"), store=store)["decision"]
            == "allow"
        )

    per_client = total // clients
    # After each decision its connection goes back to the pool, as at the end of a request (the
    # pool holds DB_POOL_MAX_SIZE connections per process, fewer than 16 or 64 threads).
    latencies, allowed, wall = _threads(clients, per_client, work, after=lambda: connection.close())
    return {
        "store": store_name,
        "clients": clients,
        "limits": limits,
        **_summary(latencies, wall),
        "budget": _overspend_check(allowed, per_client * clients, run.cap, run.ledger_spent()),
    }


def queries_per_decision(store_name: str, limits: int) -> int:
    """SQL statements one allowed decision runs (what the in-process latency is made of)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet import services
    from fleet.gate import GateRequest
    from fleet.stores import DatabaseStore

    run = Run(limits, 8)
    store = services.get_store() if store_name == "redis" else DatabaseStore()
    if store_name == "redis":
        _warm_redis_marker(run.tenant)
    warm = GateRequest(saga_id="w", step_id="1", tool="bench.charge", args=_call_args(0), agent="agent-0")
    evaluate_scoped(
        run.tenant, warm, actor=system_actor("bench"), store=store
    )  # policies now held, as in a run
    request = GateRequest(saga_id="q", step_id="1", tool="bench.charge", args=_call_args(0), agent="agent-0")
    with CaptureQueriesContext(connection) as captured:
        answer = evaluate_scoped(run.tenant, request, actor=system_actor("bench"), store=store)
    assert answer["decision"] == "allow", answer
    return len(captured.captured_queries)


def profile_decision(decisions: int) -> dict[str, Any]:
    """Where an in-process decision's time goes (Redis store, 5 limits, 1 client): CPU seconds of
    this process per decision, and cProfile's share of `evaluate` per step of it."""
    import cProfile
    import pstats

    from fleet import services
    from fleet.gate import GateRequest

    run = Run(5, 2 * decisions)
    _warm_redis_marker(run.tenant)
    store = services.get_store()

    def decide(i: int) -> None:
        request = GateRequest(
            saga_id=f"p-{i}", step_id="1", tool="bench.charge", args=_call_args(0), agent="a"
        )
        evaluate_scoped(run.tenant, request, actor=system_actor("bench"), store=store)

    decide(-1)
    wall, cpu = perf(), time.process_time()
    for i in range(decisions):
        decide(i)
    wall, cpu = perf() - wall, time.process_time() - cpu
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(decisions, 2 * decisions - 1):
        decide(i)
    profiler.disable()
    steps = {
        ("fleet/actions/decision.py", "evaluate"): "evaluate",
        ("core/epoch.py", "read"): "tenant epoch read (one cache MGET: counter and hold)",
        ("fleet/actions/snapshot.py", "read_policies"): "re-reading policies (epoch moved)",
        ("fleet/gate.py", "idempotency_key"): "idempotency key (canonical JSON, SHA-256)",
        ("fleet/gate.py", "debits_for"): "debits (scope keys, amounts)",
        ("fleet/stores.py", "check_and_debit"): "Redis check-and-debit (EVALSHA)",
        ("redis/client.py", "_send_command_parse_response"): "waiting for Redis (GET + EVALSHA)",
        ("fleet/actions/writers.py", "write_lean"): "ledger row (one batch: SET LOCAL + INSERT, committed)",
        ("psycopg/connection.py", "wait"): "waiting for Postgres (the batch and its commit)",
        ("django/db/models/sql/compiler.py", "as_sql"): "ORM: compiling SQL (all queries)",
    }
    cumulative: dict[str, float] = {}
    for (filename, _line, name), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        for (suffix, wanted), label in steps.items():
            if name == wanted and filename.endswith(suffix):
                cumulative[label] = cumulative.get(label, 0.0) + row[3]
    total = cumulative.get("evaluate", 0.0) or 1.0
    return {
        "decisions": decisions,
        "wall_ms_per_decision": round(wall * 1000 / decisions, 3),
        "cpu_ms_per_decision": round(cpu * 1000 / decisions, 3),
        "share_of_evaluate_under_cprofile": {
            k: round(v / total, 3)
            for k, v in sorted(cumulative.items(), key=lambda kv: -kv[1])
            if k != "evaluate"
        },
    }


def profile_http_decision(decisions: int) -> dict[str, Any]:
    """The HTTP route's own work per decision, without the server around it: what
    `controlplane.gate_asgi` runs on its thread for one `POST /api/v1/gate/evaluate` (key check,
    body, decision, answer; Redis store, 5 limits). CPU ms per decision unprofiled, then cProfile's
    shares on the CPU clock (not wall: waiting is not CPU) scaled to it."""
    import cProfile
    import pstats

    from controlplane import gate_asgi

    run = Run(5, 2 * decisions + 2, keys=True)
    _warm_redis_marker(run.tenant)
    prefix = uuid.uuid4().hex[:8]

    def body(i: int) -> bytes:
        fields = {"saga_id": f"{prefix}-{i}", "step_id": "1", "tool": "bench.charge", "args": _call_args(0)}
        return json.dumps({**fields, "agent": "a"}).encode()

    assert gate_asgi._decide(run.gate_key, body(-1), "bench-request") is not None
    cpu = time.process_time()
    for i in range(decisions):
        gate_asgi._decide(run.gate_key, body(i), "bench-request")
    cpu_ms = (time.process_time() - cpu) * 1000 / decisions
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for i in range(decisions, 2 * decisions):
        gate_asgi._decide(run.gate_key, body(i), "bench-request")
    profiler.disable()
    steps = {
        ("controlplane/gate_asgi.py", "_decide"): "total",
        ("tenants/authentication.py", "verify_api_key"): "API key check (with the epoch MGET)",
        ("core/epoch.py", "read"): "tenant epoch MGET",
        ("controlplane/parsers.py", "strict_loads"): "JSON body parse",
        ("fleet/calls.py", "gate_call"): "body to GateRequest",
        ("fleet/gate.py", "debits_for"): "debits (scope digests)",
        ("fleet/stores.py", "check_and_debit"): "EVALSHA (redis-py pack, send, parse)",
        ("fleet/actions/writers.py", "write_lean"): "ledger batch (with taking a pooled connection)",
        ("django/db/backends/base/base.py", "ensure_connection"): "taking a pooled connection (+ check)",
        ("fleet/actions/decision.py", "evaluate"): "the whole decision",
    }
    cumulative: dict[str, float] = {}
    for (filename, _line, name), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        for (suffix, wanted), label in steps.items():
            if name == wanted and filename.endswith(suffix):
                cumulative[label] = cumulative.get(label, 0.0) + row[3]
    total = cumulative.pop("total", 0.0) or 1.0
    return {
        "decisions": decisions,
        "cpu_ms_per_decision": round(cpu_ms, 3),
        "cpu_ms_per_step_from_cprofile_shares": {
            k: round(v / total * cpu_ms, 3) for k, v in sorted(cumulative.items(), key=lambda kv: -kv[1])
        },
    }
