"""tests/sdk fixtures for the framework adapters' tests (LangGraph, OpenAI Agents SDK): an agent's API
key with every scope (created by alice, the requester of what it asks) and an approval policy on
`wire`, ann the approver; limits and approvals kept in the database the live server shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleet import services as fleet
from fleet.stores import DatabaseStore
from tenants import services as tenants
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Role, Tenant
from tests.support.approvals import Agent, wire_policy
from tests.support.factories import ALL_SCOPES, Person, make_person
from tests.support.scoping import in_tenant


@pytest.fixture
def key(alice: Person) -> Iterator[Agent]:
    fleet.set_store(DatabaseStore())
    made, raw = in_tenant(
        tenants.create_api_key,
        alice.tenant,
        NewApiKey(name="adapter-bot", scopes=ALL_SCOPES),
        created_by=alice.user,
        actor=named_actor("test"),
    )
    wire_policy(alice.tenant, tool="wire", eligible_roles=["approver"])
    yield Agent(alice.tenant, made.prefix, raw)
    fleet.set_store(None)


@pytest.fixture
def approver(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "ann", Role.APPROVER)
