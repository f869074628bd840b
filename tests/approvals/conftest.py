"""Approvals fixtures: a tenant whose agent's key belongs to alice (the requester) and three
approvers (ann and ben, approvers; adam, an admin). The helpers (Agent, wire_policy, vote, member)
are in tests/support/approvals.py."""

from __future__ import annotations

import pytest

from tenants.models import Role, Tenant
from tests.support.approvals import Agent, payments_agent
from tests.support.factories import Person, make_person


@pytest.fixture(autouse=True)
def _database_store(database_store: None) -> None:
    """Every approvals test runs on the database store (tests/conftest.database_store)."""
    return database_store


@pytest.fixture
def agent(alice: Person) -> Agent:
    """The payments agent's key, created by alice: she is the requester of what it asks."""
    return payments_agent(alice)


@pytest.fixture
def ann(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "ann", Role.APPROVER)


@pytest.fixture
def ben(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "ben", Role.APPROVER)


@pytest.fixture
def adam(tenant_a: Tenant) -> Person:
    return make_person(tenant_a, "adam", Role.ADMIN)
