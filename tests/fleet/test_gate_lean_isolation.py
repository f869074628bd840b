"""The gate's lean path writes its ledger row with the tenant set in the same statement batch
(no tenant_context): tenants sending the very same call (same idempotency key) each get their own
decision and row, one tenant's exhausted budget refuses nothing of another's, and a third tenant
sees no row of either."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from fleet import services
from fleet.models import Decision
from fleet.stores import RedisStore, marker_key
from tenants import founding
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.fleet.lean import ACTOR, ask, ledger
from tests.support.scoping import in_tenant

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _tenant(slug: str, limits: RedisStore) -> Tenant:
    tenant = founding.create_tenant(slug, slug.title(), f"owner@{slug}.example", actor=named_actor("test"))
    limits.client.set(marker_key(services.gate_tag(tenant)), "1")
    return tenant


def _same_call(amount: int) -> dict[str, Any]:
    return {"saga_id": "shared", "step_id": f"s{amount}", "tool": "stripe.charge", "args": {"amount": amount}}


def test_the_same_call_from_two_tenants_is_two_decisions_and_a_third_sees_none(
    transactional_db: None,
    store: RedisStore,  # noqa: F811 (the fixture imported above)
) -> None:
    a, b, c = (_tenant(slug, store) for slug in ("lean-a", "lean-b", "lean-c"))
    for tenant in (a, b):
        in_tenant(
            services.create_budget,
            tenant,
            services.BudgetCreate.parse(
                {"name": "cap", "tool": "stripe.*", "max_total": 10, "window_s": 3600}
            ),
            actor=ACTOR,
        )
    first_a = ask(a, _same_call(10))
    first_b = ask(b, _same_call(10))
    assert first_a["decision"] == first_b["decision"] == "allow"
    assert first_a["authorization_id"] != first_b["authorization_id"]
    assert ask(a, _same_call(10)) == first_a  # a retry: a's own first allow
    assert ask(a, _same_call(1))["reason"] == "budget_exceeded"  # a's budget is spent...
    assert ask(b, _same_call(10)) == first_b  # ...which is not b's
    assert [str(row.pk) for row in ledger(a) if row.decision == Decision.ALLOW] == [
        first_a["authorization_id"]
    ]
    assert [str(row.pk) for row in ledger(b) if row.decision == Decision.ALLOW] == [
        first_b["authorization_id"]
    ]
    assert ledger(c) == []
    with connection.cursor() as cursor:  # the batch's setting ended with it
        cursor.execute("SELECT current_setting('sagaplane.tenant_id', true)")
        assert cursor.fetchone()[0] in ("", None)
