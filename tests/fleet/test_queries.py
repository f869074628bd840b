"""Each query of `fleet/queries.py` gives the same answer on Postgres and SQLite: this module is
marked for neither, so it runs in both phases of the suite (Postgres with DATABASE_URL, embedded
SQLite without), and asserts the same answers in each."""

from __future__ import annotations

import json
import uuid

import pytest
from django.utils import timezone

from core.scoping import tenant_context
from fleet import queries
from fleet.gate import GateRequest
from fleet.models import Decision, GateDecision
from tenants import founding
from tenants.actors import named_actor
from tenants.models import Tenant


@pytest.fixture
def tenants(transactional_db: None) -> tuple[Tenant, Tenant]:
    return (
        founding.create_tenant("parity", "Parity", "owner@parity.example", actor=named_actor("test")),
        founding.create_tenant("other", "Other", "owner@other.example", actor=named_actor("test")),
    )


def insert(
    tenant: Tenant, request: GateRequest, decision: Decision, reason: str = ""
) -> tuple[bool, uuid.UUID]:
    row_id = uuid.uuid4()
    inserted = queries.insert_decision(
        tenant.pk,
        request,
        decision,
        row_id=row_id,
        reason=reason,
        detail_json=json.dumps({"retry_after": None} if reason else {}),
        debits_json=json.dumps([{"kind": "budget", "limit": "daily", "scope": "fleet", "amount": 5}]),
        decided_at=timezone.now(),
    )
    return inserted, row_id


def test_insert_decision_keeps_one_allow_per_call_and_every_refusal(tenants: tuple[Tenant, Tenant]) -> None:
    tenant, other = tenants
    call = GateRequest(saga_id="s1", step_id="charge", tool="stripe.charge", args={"amount": 5}, agent="a")
    first_allow, first_id = insert(tenant, call, Decision.ALLOW)
    second_allow, _ = insert(tenant, call, Decision.ALLOW)
    refusal, refusal_id = insert(tenant, call, Decision.DENY, reason="halted")
    elsewhere, elsewhere_id = insert(other, call, Decision.ALLOW)  # the same call, another tenant
    assert (first_allow, second_allow, refusal, elsewhere) == (True, False, True, True)
    with tenant_context(tenant):
        rows = {row.pk: row for row in GateDecision.objects.all()}
        assert set(rows) == {first_id, refusal_id}
        assert rows[first_id].answer() == {"decision": "allow", "authorization_id": str(first_id)}
        assert rows[first_id].debits == [{"kind": "budget", "limit": "daily", "scope": "fleet", "amount": 5}]
        assert rows[refusal_id].answer() == {
            "decision": "deny",
            "reason": "halted",
            "retry_after": None,
            "decision_id": str(refusal_id),
        }
        assert rows[refusal_id].idempotency_key == call.idempotency_key
    with tenant_context(other):
        assert [row.pk for row in GateDecision.objects.all()] == [elsewhere_id]
