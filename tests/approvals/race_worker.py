"""A separate process for the approvals race: vote on a request, then ask the gate for its call.

    python -m tests.approvals.race_worker '{"tenant": "acme", "approval_id": ..., "email": ...,
                                            "prefix": ..., "saga": ..., "amount": ..., "key": ...}'

Prints "ready", waits for a line on stdin (so both processes start together, without sleeping),
then prints one JSON object: what the vote did and what the gate answered.
"""

from __future__ import annotations

import json
import os
import sys

from tenants.actors import named_actor, user_actor


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from approvals import services as approvals
    from core.errors import DomainError
    from core.scoping import tenant_context
    from fleet import services as fleet
    from fleet.gate import GateRequest
    from tenants.models import Membership, Tenant
    from tests.support.scoping import in_statements

    config = json.loads(sys.argv[1])
    tenant = Tenant.objects.get(slug=config["tenant"])
    with tenant_context(tenant):
        member = Membership.objects.select_related("user", "tenant").get(user__email=config["email"])
    print("ready", flush=True)
    sys.stdin.readline()
    out: dict[str, object] = {}
    try:
        with tenant_context(tenant):
            row = approvals.vote(
                tenant, config["approval_id"], member, "approve", actor=user_actor(config["email"])
            )
        out["vote"] = row.status
    except DomainError as refused:
        out["vote"] = refused.code
    call = GateRequest(
        saga_id=config["saga"],
        step_id="1",
        tool="bank.wire",
        args={"amount": config["amount"]},
        semantics="IRREVERSIBLE",
        api_key_prefix=config["prefix"],
        client_idempotency_key=config["key"],
    )
    out["gate"] = in_statements(fleet.evaluate, tenant, call, actor=named_actor("race"))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
