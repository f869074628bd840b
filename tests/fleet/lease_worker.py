"""A separate agent process for the lease race: N threads, each an agent spending against one
budget on leases (in process) while the gate grants them, per call when it answers `per_call`.

    python -m tests.fleet.lease_worker '{"tenant": "acme", "threads": 16, "amount": 999,
                                          "effects": "/tmp/x", "redis_url"?: ...}'

Prints "ready", waits for a line on stdin, then runs until every agent met `budget_exceeded`
three times running (or the deadline), and prints one JSON object of counts. Every effect an
agent performs is first appended to the `effects` file (one line with its amount, written with
O_APPEND before the effect "happens"), so a process SIGKILLed midway leaves exactly the effects it
performed. The database and Redis come from the environment, as for any process of the project.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

from tenants.actors import named_actor

DEADLINE_S = 90.0


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.db import connection

    from fleet import services
    from fleet.gate import GateRequest
    from tenants.models import Tenant

    config = json.loads(sys.argv[1])
    tenant = Tenant.objects.get(slug=config["tenant"])
    store = None
    if config.get("redis_url"):
        import redis

        from fleet.stores import RedisStore

        store = RedisStore(redis.Redis.from_url(config["redis_url"], socket_timeout=2), services.ledger_since)
    amount = config["amount"]
    effects = os.open(config["effects"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    counts = {"leases": 0, "on_lease": 0, "per_call": 0, "refused": 0, "errors": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + DEADLINE_S

    def effect() -> None:
        os.write(effects, f"{amount}\n".encode())

    def count(name: str) -> None:
        with lock:
            counts[name] += 1

    def agent(n: int) -> None:
        refusals = 0
        request = GateRequest(
            saga_id=f"{config['prefix']}-{n}", step_id="1", tool="stripe.charge", args={"amount": amount}
        )
        try:
            while refusals < 3 and time.monotonic() < deadline:
                try:
                    refusals = _turn(services, tenant, store, request, effect, count, refusals)
                except Exception:  # Redis restarting, the store marked down: asked again
                    count("errors")
                    time.sleep(0.05)
        finally:
            connection.close()

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(config["threads"])]
    print("ready", flush=True)
    sys.stdin.readline()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(counts), flush=True)


def _turn(
    services: Any, tenant: Any, store: Any, request: Any, effect: Any, count: Any, refusals: int
) -> int:
    """One lease used up and given back, or one per-call decision. Returns the refusals in a row."""
    from tests.support.scoping import in_statements, in_tenant  # after django.setup()

    answer = in_tenant(
        services.grant_lease,
        tenant,
        request,
        calls=4,
        lease_id=uuid.uuid4(),
        actor=named_actor("test"),
        store=store,
    )
    if answer["decision"] == "lease":
        count("leases")
        granted = int(float(answer["limits"][0]["granted"]) * 10_000)
        per_call = int(float(answer["limits"][0]["per_call"]) * 10_000)
        used = 0
        while used + per_call <= granted:
            effect()
            used += per_call
            count("on_lease")
        used_text = str(used / 10_000)
        in_tenant(
            services.give_back_lease,
            tenant,
            uuid.UUID(answer["lease_id"]),
            {"fleet": used_text},
            actor=named_actor("test"),
            store=store,
        )
        return 0
    request = dataclasses.replace(request, step_id=str(uuid.uuid4()))
    decided = in_statements(services.evaluate, tenant, request, actor=named_actor("test"), store=store)
    if decided["decision"] == "allow":
        effect()
        count("per_call")
        return 0
    if decided.get("reason") == "budget_exceeded":
        count("refused")
        return refusals + 1
    time.sleep(0.05)
    return refusals


if __name__ == "__main__":
    main()
