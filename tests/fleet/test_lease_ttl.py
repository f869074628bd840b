"""The lease TTL per tenant (`/api/v1/fleet/settings`): the grant uses the tenant's, a change is
recorded with old and new values, hostile values are refused by name with nothing changed, only
those who may change the fleet change it, and one tenant's setting is not another's."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import FleetSettings
from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Role, Tenant
from tests.support.chains import server_stream
from tests.support.factories import Person, make_person
from tests.support.scoping import in_tenant

SETTINGS = "/api/v1/fleet/settings"
ACTOR = named_actor("test:lease-ttl")


pytestmark = pytest.mark.usefixtures("database_store")


def _budget(tenant: Tenant) -> None:
    body = {"name": "tokens", "tool": "llm.*", "max_total": 1000, "window_s": 3600}
    in_tenant(services.create_budget, tenant, services.BudgetCreate.parse(body), actor=ACTOR)


def _ttl_of_a_grant(tenant: Tenant) -> int:
    request = GateRequest(saga_id="s", step_id="s", tool="llm.complete", args={"amount": 1}, agent="w")
    answer = in_tenant(services.grant_lease, tenant, request, calls=2, lease_id=uuid.uuid4(), actor=ACTOR)
    assert answer["decision"] == "lease", answer
    return int(answer["ttl_ms"])


def _events(tenant: Tenant) -> list[dict[str, Any]]:
    return [r for r in server_stream(tenant) if r["event"] == "FLEET_SETTINGS_UPDATED"]


@override_settings(SAGAPLANE_LEASE_TTL_MS=1000)
def test_a_grant_lives_the_tenants_ttl_and_the_change_is_recorded(alice: Person, tenant_b: Tenant) -> None:
    _budget(alice.tenant)
    _budget(tenant_b)
    owner = alice.session_client()
    assert owner.get(SETTINGS).json() == {"lease_ttl_ms": None, "lease_ttl_ms_effective": 1000}
    assert _ttl_of_a_grant(alice.tenant) == 1000

    changed = owner.patch(SETTINGS, {"lease_ttl_ms": 250}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json() == {"lease_ttl_ms": 250, "lease_ttl_ms_effective": 250}
    assert _ttl_of_a_grant(alice.tenant) == 250
    assert _ttl_of_a_grant(tenant_b) == 1000  # another tenant keeps the default

    again = owner.patch(SETTINGS, {"lease_ttl_ms": 250}, format="json")
    assert again.status_code == 200
    back = owner.patch(SETTINGS, {"lease_ttl_ms": None}, format="json")
    assert back.json() == {"lease_ttl_ms": None, "lease_ttl_ms_effective": 1000}
    assert _ttl_of_a_grant(alice.tenant) == 1000

    events = _events(alice.tenant)
    assert [(e["old"], e["new"]) for e in events] == [
        ({"lease_ttl_ms": None}, {"lease_ttl_ms": 250}),
        ({"lease_ttl_ms": 250}, {"lease_ttl_ms": None}),
    ]  # the unchanged PATCH recorded nothing
    assert all(e["actor"].startswith("user:") for e in events)
    assert _events(tenant_b) == []


@pytest.mark.parametrize(
    "body",
    [
        {"lease_ttl_ms": 99},
        {"lease_ttl_ms": 60_001},
        {"lease_ttl_ms": 0},
        {"lease_ttl_ms": -1},
        {"lease_ttl_ms": "500"},
        {"lease_ttl_ms": 500.5},
        {"lease_ttl_ms": True},
        {"lease_ttl_ms": 10**400},
        {"lease_ttl_ms": [500]},
        {"lease_ttl_ms": {"ms": 500}},
        {},
    ],
)
def test_hostile_values_are_refused_by_name_with_nothing_changed(alice: Person, body: dict[str, Any]) -> None:
    owner = alice.session_client()
    refused = owner.patch(SETTINGS, body, format="json")
    assert refused.status_code == 400, refused.content
    answer = refused.json()
    assert answer["field"] == "lease_ttl_ms" and answer["error"] in {"invalid_lease_ttl", "invalid"}
    with tenant_context(alice.tenant):
        assert not FleetSettings.objects.exclude(lease_ttl_ms=None).exists()
    assert _events(alice.tenant) == []


def test_not_a_json_object_is_refused(alice: Person) -> None:
    refused = alice.session_client().patch(SETTINGS, [1, 2], format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "body"


def test_who_may_change_it(alice: Person) -> None:
    approver = make_person(alice.tenant, "apu", Role.APPROVER)
    assert approver.session_client().get(SETTINGS).status_code == 200
    assert approver.session_client().patch(SETTINGS, {"lease_ttl_ms": 500}, format="json").status_code == 403
    _, raw = in_tenant(
        tenant_services.create_api_key,
        alice.tenant,
        NewApiKey(name="gate", scopes=["gate"]),
        actor=named_actor("test"),
    )
    gate_key = APIClient()
    gate_key.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert gate_key.patch(SETTINGS, {"lease_ttl_ms": 500}, format="json").status_code == 403
    _, raw = in_tenant(
        tenant_services.create_api_key,
        alice.tenant,
        NewApiKey(name="control", scopes=["control"]),
        actor=named_actor("test"),
    )
    control = APIClient()
    control.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    changed = control.patch(SETTINGS, {"lease_ttl_ms": 500}, format="json")
    assert changed.status_code == 200 and changed.json()["lease_ttl_ms"] == 500
    assert _events(alice.tenant)[0]["actor"].startswith("api-key:")
