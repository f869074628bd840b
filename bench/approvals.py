"""Approvals benchmark (issue 12): from the deciding vote to the waiting agent resuming.

N agents (100; --quick: 20) each ask the gate for a wire an approval policy covers and get
`pending_approval`; each then waits as the SDK does (`Gate._await_approval`: the long-poll
`GET /api/v1/approvals/<id>/wait`, served by the production command, gunicorn with 2 uvicorn
workers). A member then approves the requests one by one (`approvals.services.vote`, in this
process); for each, the time from its vote's commit to its agent resuming (the long-poll answered
"approved") and to its agent holding the authorisation (the gate asked again, the approval
consumed) is measured on this process' monotonic clock. Every authorisation must be distinct and
every request consumed exactly once, or the run fails.

The peer, in the same run: agent-saga's `ApprovalGateway` on its `RedisApprovalStore` (the same
private Redis) with its default `poll_interval` (1 s): N coroutines wait, the store's `decide`
grants each, and the time from the decision to the gateway returning is measured the same way.

Target (reported, not asserted): p95 < 1 s from the vote to the agent resuming.

Needs Postgres (DATABASE_URL and DATABASE_OWNER_URL, as infra/services.sh sets them) and
`redis-server`: works in its own database `<name>_bench_approvals` and its own Redis. Writes
bench/results/approvals.json (`--quick`: approvals-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from tenants.actors import system_actor, user_actor

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_gate", ROOT / "bench" / "gate.py")
assert _spec is not None and _spec.loader is not None
gb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gb)  # the gate benchmark's helpers: private Redis, gunicorn, Django set-up
from bench.support.gate_common import _pct  # noqa: E402

TARGET_P95_S = 1.0


def _database_urls(url: str, owner_url: str) -> tuple[str, str]:
    import psycopg

    if not owner_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_OWNER_URL (the owner role) beside DATABASE_URL")
    name = f"{urllib.parse.urlsplit(url).path.lstrip('/') or 'sagaplane'}_bench_approvals"

    def beside(base: str) -> str:
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(base)._replace(path=f"/{name}"))

    admin = urllib.parse.urlsplit(owner_url.replace("postgres://", "postgresql://", 1))
    with psycopg.connect(urllib.parse.urlunsplit(admin._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return beside(url), beside(owner_url)


def _stats(samples: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": round(_pct(ms, 50), 1),
        "p95_ms": round(_pct(ms, 95), 1),
        "max_ms": round(max(ms), 1),
        "mean_ms": round(statistics.fmean(ms), 1),
    }


def ours(url: str, agents: int, spacing_s: float) -> dict[str, Any]:
    from sagaplane.gate import Gate, GateDenied

    from approvals import services as approvals
    from approvals.models import ApprovalRequest, Status
    from core.scoping import tenant_context
    from tenants import founding
    from tenants import services as tenant_services
    from tenants.models import Membership, Role

    slug = f"appr-{uuid.uuid4().hex[:10]}"
    tenant = founding.create_tenant(
        slug, "Approvals bench", f"owner@{slug}.example", actor=system_actor("bench")
    )
    with tenant_context(tenant):
        approvals.create_policy(
            tenant,
            approvals.PolicyCreate.parse(
                {"name": "wires", "tool": "bench.wire", "eligible_roles": ["approver"], "ttl_s": 600}
            ),
            actor=system_actor("bench"),
        )
    with tenant_context(tenant):  # tenants' services assert the scope, as a command enters it
        tenant_services.add_member(tenant, f"risk@{slug}.example", Role.APPROVER, actor=system_actor("bench"))
        risk = Membership.objects.select_related("user", "tenant").get(user__email=f"risk@{slug}.example")
        _, key = tenant_services.create_api_key(
            tenant, tenant_services.NewApiKey(name="agent", scopes=["gate"]), actor=system_actor("bench")
        )

    # Warm the tenant's Redis state (its first call rebuilds it from the ledger) outside the timing.
    warm = Gate(url, key)
    assert (
        warm._evaluate({"saga_id": "warm", "step_id": "1", "tool": "bench.read", "args": {}})["decision"]
        == "allow"
    )
    warm.close()
    pending: dict[int, str] = {}
    resumed: dict[int, float] = {}
    authorised: dict[int, tuple[float, str]] = {}
    failures: list[str] = []
    asked = threading.Barrier(agents + 1)

    def agent(n: int) -> None:
        gate = Gate(url, key)  # no status thread: the bench asks the gate directly, as check() does
        body = {"saga_id": f"bench-{n}", "step_id": "1", "tool": "bench.wire", "args": {"amount": 1000 + n}}
        try:
            for _attempt in range(50):  # a loaded machine's bounded pool wait refuses, fail closed
                try:
                    answer = gate._evaluate(body)
                    break
                except GateDenied as denied:
                    if denied.reason != "control_plane_unavailable":
                        raise
                    time.sleep(0.1)
            assert answer["decision"] == "pending_approval", answer
            pending[n] = answer["approval_id"]
            asked.wait()
            gate._await_approval(answer)
            resumed[n] = time.monotonic()
            allowed = gate._evaluate(body)
            assert allowed["decision"] == "allow", allowed
            authorised[n] = (time.monotonic(), allowed["authorization_id"])
        except Exception as exc:  # reported; the run fails below
            failures.append(f"agent {n}: {exc!r}")
            if n not in pending:
                asked.abort()
        finally:
            gate.close()

    threads = [threading.Thread(target=agent, args=(n,), daemon=True) for n in range(agents)]
    for thread in threads:
        thread.start()
    try:
        asked.wait(timeout=300)
    except threading.BrokenBarrierError:
        raise SystemExit(f"approvals bench failed before every agent waited: {failures[:5]}") from None
    time.sleep(1.0)  # let every agent's first long-poll reach the server (not a synchronisation)
    committed: dict[str, float] = {}

    def on_decided(event: Any) -> None:  # runs right after the deciding vote's commit
        if event.kind == "decided":
            committed[event.request["id"]] = time.monotonic()

    from approvals import hooks

    hooks.on_approval_event(on_decided)
    try:
        for n in range(agents):
            with tenant_context(tenant):  # a vote, its own transaction, as the page's
                approvals.vote(tenant, pending[n], risk, "approve", actor=user_actor("risk"))
            time.sleep(spacing_s)
    finally:
        hooks._hooks.remove(on_decided)
    voted = {n: committed[pending[n]] for n in range(agents)}
    for thread in threads:
        thread.join(timeout=120)
    if failures or len(authorised) != agents:
        raise SystemExit(f"approvals bench failed: {failures[:5]} ({len(authorised)}/{agents} authorised)")
    ids = {auth for _, auth in authorised.values()}
    with tenant_context(tenant):
        consumed = ApprovalRequest.objects.filter(status=Status.CONSUMED).count()
    if len(ids) != agents or consumed != agents:
        raise SystemExit(f"each approval must authorise once: {len(ids)} ids, {consumed} consumed")
    return {
        "agents": agents,
        "vote_to_resume": _stats([resumed[n] - voted[n] for n in range(agents)]),
        "vote_to_authorised": _stats([authorised[n][0] - voted[n] for n in range(agents)]),
        "resume_to_authorised": _stats([authorised[n][0] - resumed[n] for n in range(agents)]),
        "authorisations": len(ids),
        "consumed": consumed,
    }


def agent_saga_peer(redis_url: str, agents: int, spacing_s: float) -> dict[str, Any]:
    import redis
    from agent_saga.approvals import ApprovalGateway, ApprovalPolicy, RedisApprovalStore

    prefix = f"bench-approvals:{uuid.uuid4().hex[:8]}:"
    store = RedisApprovalStore(
        client=redis.Redis.from_url(redis_url, decode_responses=True), key_prefix=prefix
    )
    policy = ApprovalPolicy(timeout=600)  # its default poll_interval: 1 s

    class Ctx:
        def __init__(self, n: int) -> None:
            self.tool = "bench.wire"
            self.kwargs = {"amount": 1000 + n}

    class Rule:
        name = "wires"
        reason = "bench"

    class Quiet:
        def notify(self, request: Any, targets: Any) -> None:
            return None

    async def run() -> tuple[dict[int, float], dict[int, float]]:
        from agent_saga.observability import set_saga_id, step_scope

        returned: dict[int, float] = {}
        decided: dict[int, float] = {}
        ids: dict[int, str] = {}

        async def one(n: int) -> None:
            gateway = ApprovalGateway(store=store, notifier=Quiet(), policy=policy)
            set_saga_id(f"bench-{n}")  # this task's own context (asyncio copies it per task)
            with step_scope("1"):
                ok = await gateway(Ctx(n), Rule())
            assert ok
            returned[n] = time.monotonic()

        tasks = [asyncio.create_task(one(n)) for n in range(agents)]
        deadline = time.monotonic() + 60
        while len(ids) < agents and time.monotonic() < deadline:
            for request in store.pending():
                ids.setdefault(int(request.saga_id.split("-")[1]), request.id)
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        for n in range(agents):
            store.decide(ids[n], granted=True, approver="risk")
            decided[n] = time.monotonic()
            await asyncio.sleep(spacing_s)
        await asyncio.gather(*tasks)
        return decided, returned

    decided, returned = asyncio.run(run())
    return {
        "agents": agents,
        "poll_interval_s": policy.poll_interval,
        "decision_to_resume": _stats([returned[n] - decided[n] for n in range(agents)]),
    }


def _run(
    folder: Path, db_base: str, agents: int, spacing: float, workers: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    with gb.private_redis(folder) as redis_url:
        db_url, owner_url = _database_urls(db_base, os.environ.get("DATABASE_OWNER_URL", ""))
        gb._setup_django(db_url, owner_url, redis_url, folder / "data")
        print(f"== approvals benchmark: {agents} waiting agents")
        env = gb._server_env(db_url, redis_url, folder / "data", "redis")
        env["DB_POOL_MAX_SIZE"] = "8"
        env.setdefault("SAGAPLANE_PUBLIC_URL", "https://127.0.0.1")
        with gb._gunicorn(env, workers, folder / "gunicorn.log") as url:
            mine = ours(url, agents, spacing)
        peer = agent_saga_peer(redis_url, agents, spacing)
    return mine, peer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20 agents (CI)")
    parser.add_argument("--agents", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    db_base = os.environ.get("DATABASE_URL", "")
    if not db_base.startswith(("postgres://", "postgresql://")):
        print("approvals bench: needs Postgres (DATABASE_URL); skipped")
        return 0
    agents = args.agents or (20 if args.quick else 100)
    spacing = 0.02
    out = Path(
        args.out or ROOT / "bench" / "results" / ("approvals-quick.json" if args.quick else "approvals.json")
    )
    folder = Path(tempfile.mkdtemp(prefix=".bench-approvals-", dir=ROOT / "bench"))
    load_before = os.getloadavg()[0]
    try:
        mine, peer = _run(folder, db_base, agents, spacing, args.workers)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    r, a, p = mine["vote_to_resume"], mine["vote_to_authorised"], peer["decision_to_resume"]
    print(
        f"ours: vote → SDK resumes     p50 {r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f} ms  "
        f"max {r['max_ms']:7.1f} ms"
    )
    print(f"ours: vote → authorised      p50 {a['p50_ms']:7.1f} ms  p95 {a['p95_ms']:7.1f} ms")
    print(f"agent-saga poll loop (1 s):  p50 {p['p50_ms']:7.1f} ms  p95 {p['p95_ms']:7.1f} ms")
    ratio = round(r["p95_ms"] / p["p95_ms"], 3) if p["p95_ms"] else None
    print(
        f"p95 ours / agent-saga: {ratio}; target p95 < {TARGET_P95_S * 1000:.0f} ms: "
        f"{'met' if r['p95_ms'] < TARGET_P95_S * 1000 else 'NOT met'}"
    )
    result = {
        "benchmark": "approvals",
        "quick": args.quick,
        "database": "postgresql",  # the only store it runs on (it skips without DATABASE_URL)
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_before": load_before},
        "server": "gunicorn controlplane.asgi:application -k uvicorn.workers.UvicornWorker "
        f"--workers {args.workers}",
        "ours": mine,
        "agent_saga_peer": peer,
        "p95_ratio_ours_to_agent_saga": ratio,
        "target_p95_ms": TARGET_P95_S * 1000,
        "target_met": r["p95_ms"] < TARGET_P95_S * 1000,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
