"""Tenant isolation, enumerated from the URL resolver so a new route is covered the day it lands.

For every API route: carol (tenant bravo), with her session and with her all-scopes API key,
asks for acme's objects and gets 403/404, and nothing she receives carries one of acme's markers
(its slug, name, key prefix, e-mail, record hashes, and its own stream, saga, saga name and step
ids: every tenant has different ones, tests/support/chains.py). Her listings are empty, or hold
exactly her own tenant's keys and members, and do not change when acme grows. A route with a URL
parameter this file has no acme sample for fails the test: add the sample, don't skip the route.
The same walk proves each scoping layer on its own (test_isolation_layers.py).
"""

from __future__ import annotations

import pytest

from tenants.actors import named_actor
from tenants.models import ApiKey, Tenant
from tenants.permissions import TenantScopedViewMixin
from tests.support.factories import Person
from tests.support.isolation import api_routes, assert_sees_nothing_of, fill_route, view_class_of


def test_there_are_api_routes_to_check() -> None:
    assert len(api_routes()) >= 3


@pytest.mark.parametrize("route", [route for route, _ in api_routes()])
def test_every_api_view_inherits_the_tenant_mixin(route: str) -> None:
    pattern = dict(api_routes())[route]
    view_class = view_class_of(pattern)
    assert view_class is not None and issubclass(view_class, TenantScopedViewMixin), (
        f"{route} is served by {view_class}, which does not inherit TenantScopedViewMixin"
    )


@pytest.mark.smoke
def test_carol_sees_nothing_of_acme(tenant_a: Tenant, alice: Person, bob: Person, carol: Person) -> None:
    assert assert_sees_nothing_of(carol, tenant_a, alice) > 0


@pytest.mark.smoke
def test_a_third_tenant_sees_nothing_of_the_first_two(
    tenant_a: Tenant, tenant_b: Tenant, alice: Person, carol: Person
) -> None:
    from tenants import founding
    from tests.support.factories import make_person

    tenant_c = founding.create_tenant(
        "charlie", "Charlie Freight", "founder@charlie.example", "x" * 12, actor=named_actor("test")
    )
    dave = make_person(tenant_c, "dave", "owner")
    assert assert_sees_nothing_of(dave, tenant_a, alice) > 0
    assert assert_sees_nothing_of(dave, tenant_b, carol) > 0


@pytest.mark.smoke
def test_acme_members_do_see_their_own_data(tenant_a: Tenant, alice: Person) -> None:
    """The other half of the isolation proof: the same routes do return acme's data to acme,
    so carol's empty answers are scoping at work, not broken views."""
    response = alice.session_client().get("/api/v1/keys")
    assert response.status_code == 200
    assert ApiKey.prefix_of(alice.api_key) in response.content.decode()
    for route, _ in api_routes():
        if "<" not in route:
            continue
        url = fill_route(route, tenant_a, alice)
        statuses = {alice.session_client().get(url).status_code, alice.key_client().get(url).status_code}
        assert statuses & {200, 405, 409}, f"acme's own {url} answered {statuses} to acme"
