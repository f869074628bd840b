"""agent-saga's own `SagaCloudClient.get_fleet_budget`, pointed at a live Sagaplane, sees the
fleet's real spend from the gate's ledger (agent-saga's shape: status, total_spend, fleet_nodes),
within the window it asks for, and only its own tenant's."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from agent_saga.cloud import SagaCloudClient
from django.utils import timezone

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import GateDecision
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.factories import Person
from tests.support.scoping import in_statements, in_tenant

NO_RESERVATIONS = {"reserved": "0", "settled": "0", "overrun": "0"}

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("database_store")]


def _client(live_server: Any, person: Person) -> SagaCloudClient:
    return SagaCloudClient(api_key=person.api_key, endpoint=f"{live_server.url}/v1", raise_on_error=True)


def _budget(live_server: Any, person: Person, window: float | None = None) -> dict[str, Any]:
    return asyncio.run(_client(live_server, person).get_fleet_budget(window=window))


def _ask(tenant: Tenant, n: int, agent: str, tool: str = "stripe.charge", **args: Any) -> str:
    call = GateRequest(saga_id=f"s-{agent}-{n}", step_id="1", tool=tool, args=args, agent=agent)
    return in_statements(services.evaluate, tenant, call, actor=named_actor("test"))["decision"]


def test_get_fleet_budget_sees_the_real_spend(live_server: Any, alice: Person, carol: Person) -> None:
    before = _budget(live_server, alice)
    assert (before["status"], before["total_spend"], before["fleet_nodes"]) == ("ok", 0, 0)
    in_tenant(
        services.create_budget,
        alice.tenant,
        services.BudgetCreate.parse(
            {"name": "daily stripe", "tool": "stripe.*", "max_total": 50_000, "window_s": 86400}
        ),
        actor=named_actor("test"),
    )
    # A second budget on the same calls: a call it also matches is still spent once.
    in_tenant(
        services.create_budget,
        alice.tenant,
        services.BudgetCreate.parse(
            {"name": "big cards", "tool": "stripe.*", "max_total": 10**9, "window_s": 3600}
        ),
        actor=named_actor("test"),
    )
    decisions = [_ask(alice.tenant, n, "billing-bot", amount=20_000) for n in range(3)]
    decisions.append(_ask(alice.tenant, 9, "refund-bot", amount=9_999.5))
    decisions.append(_ask(alice.tenant, 10, "crm-bot", tool="crm.insert"))  # ungoverned: spends nothing
    assert decisions == ["allow", "allow", "deny", "allow", "allow"]
    answer = _budget(live_server, alice)
    assert answer["status"] == "ok"
    assert answer["total_spend"] == 49_999.5  # the refusal spent nothing
    assert answer["fleet_nodes"] == 3
    usage = {b["name"]: b["usage"] for b in answer["budgets"]}
    assert usage["daily stripe"] == [
        {
            "scope": "fleet",
            "used": "49999.5",
            "leased": "0",
            **NO_RESERVATIONS,
            "cap": "50000",
            "ratio": 0.99999,
        }
    ]
    # The window: a spend older than it is not counted.
    with tenant_context(alice.tenant):
        first = GateDecision.objects.filter(saga_id="s-billing-bot-0").get()
        GateDecision.objects.filter(pk=first.pk).update(decided_at=timezone.now() - timedelta(hours=2))
    assert _budget(live_server, alice, window=3600)["total_spend"] == 29_999.5
    assert _budget(live_server, alice, window=3 * 3600)["total_spend"] == 49_999.5
    # Another tenant's agent sees only its own fleet.
    other = _budget(live_server, carol)
    assert (other["total_spend"], other["fleet_nodes"], other["budgets"]) == (0, 0, [])


@pytest.mark.parametrize("window", ["0", "-5", "nan", "inf", "abc", "1e400", "9" * 100, str(10**9)])
def test_a_bad_window_is_a_400_in_the_error_shape(live_server: Any, alice: Person, window: str) -> None:
    request = urllib.request.Request(
        f"{live_server.url}/v1/fleet/budget?window={window}",
        headers={"Authorization": f"Bearer {alice.api_key}"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    body = json.loads(refused.value.read())
    assert body["error"] == "invalid" and body["field"] == "window"
