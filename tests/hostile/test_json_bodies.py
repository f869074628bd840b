"""Every JSON body a DRF view parses is strict: a lone surrogate (valid JSON text that no column,
log or answer can hold), a key named twice, NaN or Infinity is a 400 `malformed_json` that changes
nothing — never a 500 from the database or the renderer."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.scoping import tenant_context
from fleet.models import GateDecision, Halt
from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import ApiKey
from tests.support.factories import Person
from tests.support.scoping import in_tenant

BODIES = {
    "lone surrogate in a value": b'{"scope": "tool:\\ud800", "reason": "r", "name": "n", "saga_id": "s"}',
    "lone surrogate in a key": b'{"\\udfff": 1, "scope": "*", "reason": "r", "name": "n"}',
    "duplicate key": b'{"scope": "*", "scope": "tool:x", "reason": "r", "name": "n", "scopes": ["read"]}',
    "NaN": b'{"scope": "*", "reason": "r", "name": "n", "args": {"amount": NaN}}',
    "Infinity": b'{"scope": "*", "reason": "r", "name": "n", "max_total": Infinity}',
}
ROUTES = ["/api/v1/fleet/halts", "/api/v1/fleet/budgets", "/api/v1/keys", "/api/v1/gate/evaluate"]


@pytest.mark.parametrize("kind", list(BODIES))
def test_a_body_no_store_can_hold_is_a_400_that_changes_nothing(alice: Person, kind: str) -> None:
    _, raw = in_tenant(
        tenant_services.create_api_key,
        alice.tenant,
        NewApiKey(name="gate", scopes=["gate"]),
        actor=named_actor("test"),
    )
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    owner = alice.session_client()
    with tenant_context(alice.tenant):
        keys_before = ApiKey.objects.count()
    for route in ROUTES:
        client = agent if route.endswith("evaluate") else owner
        response = client.post(route, BODIES[kind], content_type="application/json")
        assert response.status_code == 400, (route, response.content)
        assert response.json()["error"] == "malformed_json", route
    with tenant_context(alice.tenant):
        assert not Halt.objects.exists() and not GateDecision.objects.exists()
        assert ApiKey.objects.count() == keys_before
