"""The Fleet page's circuit breakers without a browser: the form (no JSON typed) creates one as the
API would, a hostile value is shown beside its field and changes nothing, the history of its
transitions is shown, and a third tenant sees and deletes nothing of two tenants' breakers."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from core.scoping import tenant_context
from fleet import services
from fleet.models import BreakerTransition, CircuitBreaker
from tenants import founding
from tenants.actors import named_actor
from tenants.models import Role, Tenant
from tests.support.chains import server_stream
from tests.support.factories import Person, make_person
from tests.support.scoping import in_tenant

FORM = {
    "name": "vendor down",
    "tool": "vendor.*",
    "consecutive_failures": "3",
    "failure_rate": "50",
    "min_volume": "20",
    "window": "1",
    "window_unit": "min",
    "cool_down": "30",
    "cool_down_unit": "s",
}


pytestmark = pytest.mark.usefixtures("database_store")


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def breakers(tenant: Tenant) -> list[tuple[str, Any]]:
    with tenant_context(tenant):
        return list(CircuitBreaker.objects.order_by("name").values_list("name", "failure_rate"))


def test_the_form_creates_a_breaker_and_its_history_is_shown(alice: Person) -> None:
    page = browser(alice)
    created = page.post("/fleet/breakers", FORM)
    assert created.status_code == 302
    ((name, rate),) = breakers(alice.tenant)
    assert (name, str(rate)) == ("vendor down", "0.5000")
    record = server_stream(alice.tenant)[-1]
    assert record["event"] == "FLEET_BREAKER_CREATED" and record["new"]["window_s"] == 60
    with tenant_context(alice.tenant):
        row = CircuitBreaker.objects.get()
    in_tenant(services.trip, alice.tenant, services.breaker_spec(row), "3 consecutive failures (threshold 3)")
    body = page.get("/fleet/").content.decode()
    assert 'data-breaker="vendor down" data-state="open" data-phase="open"' in body
    assert 'data-transition="closed-open"' in body and "3 consecutive failures (threshold 3)" in body


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("failure_rate", "150", "failure_rate"),
        ("failure_rate", "fifty", "failure_rate"),
        ("failure_rate", "12.345", "failure_rate"),
        ("consecutive_failures", "0", "consecutive_failures"),
        ("consecutive_failures", "٣", "consecutive_failures"),
        ("min_volume", "9" * 60, "min_volume"),
        ("cool_down", "-1", "cool_down_s"),
        ("cool_down_unit", "weeks", "cool_down_s"),
        ("name", " ", "name"),
        ("tool", "", "tool"),
    ],
)
def test_a_hostile_form_value_is_shown_beside_its_field_and_changes_nothing(
    alice: Person, field: str, value: str, named: str
) -> None:
    before = len(server_stream(alice.tenant))
    answer = browser(alice).post("/fleet/breakers", {**FORM, field: value})
    assert answer.status_code == 400
    body = answer.content.decode()
    assert 'role="alert"' in body and named.split("_s")[0].replace("_", "") in body.replace("_", "")
    assert breakers(alice.tenant) == [] and len(server_stream(alice.tenant)) == before


def test_readers_see_breakers_but_cannot_change_them(alice: Person, tenant_a: Tenant) -> None:
    browser(alice).post("/fleet/breakers", FORM)
    viewer = browser(make_person(tenant_a, "vic", Role.VIEWER))
    body = viewer.get("/fleet/").content.decode()
    assert 'data-breaker="vendor down"' in body and 'id="breaker-form"' not in body
    assert viewer.post("/fleet/breakers", {**FORM, "name": "other"}).status_code == 403
    with tenant_context(tenant_a):
        pk = CircuitBreaker.objects.get().pk
    assert viewer.post(f"/fleet/breakers/{pk}/delete").status_code == 403
    assert [n for n, _ in breakers(tenant_a)] == ["vendor down"]


def test_a_third_tenant_sees_and_deletes_nothing_of_two_tenants_breakers(
    alice: Person, carol: Person
) -> None:
    browser(alice).post("/fleet/breakers", {**FORM, "name": "acme breaker"})
    browser(carol).post("/fleet/breakers", {**FORM, "name": "bravo breaker"})
    third = founding.create_tenant("charlie", "Charlie", "founder@charlie.example", actor=named_actor("test"))
    dave = browser(make_person(third, "dave", Role.OWNER))
    body = dave.get("/fleet/").content.decode()
    assert "acme breaker" not in body and "bravo breaker" not in body and 'id="no-breakers"' in body
    for tenant in (alice.tenant, carol.tenant):
        with tenant_context(tenant):
            pk = CircuitBreaker.objects.get().pk
        assert dave.post(f"/fleet/breakers/{pk}/delete").status_code == 404
    assert [n for n, _ in breakers(alice.tenant)] == ["acme breaker"]
    assert [n for n, _ in breakers(carol.tenant)] == ["bravo breaker"]
    with tenant_context(third):
        assert BreakerTransition.objects.count() == 0
