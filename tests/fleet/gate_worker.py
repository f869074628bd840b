"""A separate agent process for the gate's concurrency tests: N threads each asking the gate.

    python -m tests.fleet.gate_worker run '{"tenant": "acme", "threads": 16, "calls": 1, ...}'
    python -m tests.fleet.gate_worker setup '{"tenant": "acme", "max_total": 50000}'

`run` prints "ready", waits for a line on stdin (so every process starts together, without
sleeping), then prints one JSON list of the answers. The database and Redis come from the
environment (DATABASE_URL / REDIS_URL / SAGAPLANE_DATA_DIR), as for any process of the project.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from tenants.actors import named_actor


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.db import connection

    from fleet import services
    from fleet.gate import GateRequest
    from tenants.models import Tenant
    from tests.support.scoping import in_statements, in_tenant

    command, config = sys.argv[1], json.loads(sys.argv[2])
    if command == "setup":
        from tenants import founding

        tenant = founding.create_tenant(
            config["tenant"], "Gate test", "owner@gate.example", actor=named_actor("test")
        )
        in_tenant(
            services.create_budget,
            tenant,
            services.BudgetCreate.parse(
                {"name": "fleet", "tool": "stripe.*", "max_total": config["max_total"], "window_s": 86400}
            ),
            actor=named_actor("test"),
        )
        print(tenant.pk, flush=True)
        return

    tenant = Tenant.objects.get(slug=config["tenant"])
    store = None
    if config.get("redis_url") or config.get("redis_cluster_url"):
        import redis
        from redis.cluster import RedisCluster

        from fleet.stores import RedisStore

        client = (
            RedisCluster.from_url(config["redis_cluster_url"], socket_timeout=5)
            if config.get("redis_cluster_url")
            else redis.Redis.from_url(config["redis_url"], socket_timeout=5)
        )
        store = RedisStore(client, services.ledger_since)
    answers: list[dict[str, Any]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(config["threads"])
    prefix = config["prefix"]

    def client(n: int) -> None:
        barrier.wait()
        try:
            for call in range(config["calls"]):
                request = GateRequest(
                    saga_id=f"{prefix}-{n}-{call}",
                    step_id="1",
                    tool=config.get("tool", "stripe.charge"),
                    args={"amount": config["amount"]},
                )
                try:
                    answer = in_statements(
                        services.evaluate, tenant, request, actor=named_actor("test"), store=store
                    )
                except Exception as exc:  # never an answer: the test names it
                    answer = {"decision": "raised", "reason": repr(exc)[:500]}
                with lock:
                    answers.append(answer)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(config["threads"])]
    print("ready", flush=True)
    sys.stdin.readline()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(answers), flush=True)


if __name__ == "__main__":
    main()
