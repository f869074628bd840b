"""Another process of the fleet, holding its own per-process copies (policy snapshots, verified API
keys) between commands, for the tests that a change reaches every process at once.

    python -m tests.fleet.lean_worker '{"tenant": "acme", "redis_url": "redis://..."}'

Prints "ready", then answers each line on stdin with one JSON line:
- `decide <json GateRequest fields>`: the gate's answer (`fleet.services.evaluate`, outside any
  transaction, on the Redis store at `redis_url`);
- `verify <raw API key>`: `{"ok": true}` or `{"error": <code>}` (`verify_api_key`).
The database and the cache come from the environment (DATABASE_URL / REDIS_URL).
"""

from __future__ import annotations

import json
import os
import sys

from tenants.actors import named_actor


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    import redis
    from django.db import connection
    from rest_framework.exceptions import AuthenticationFailed

    from fleet import services
    from fleet.gate import GateRequest
    from fleet.stores import RedisStore
    from tenants.authentication import verify_api_key
    from tenants.models import Tenant
    from tests.support.scoping import in_statements

    config = json.loads(sys.argv[1])
    tenant = Tenant.objects.get(slug=config["tenant"])
    store = RedisStore(redis.Redis.from_url(config["redis_url"], socket_timeout=5), services.ledger_since)
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "decide":
            request = GateRequest(**json.loads(argument))
            answer = in_statements(
                services.evaluate, tenant, request, actor=named_actor("worker"), store=store
            )
        elif command == "verify":
            try:
                verify_api_key(argument)
                answer = {"ok": True}
            except AuthenticationFailed as exc:
                answer = {"error": exc.get_codes()}
        else:
            raise SystemExit(f"unknown command {command!r}")
        connection.close()
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
