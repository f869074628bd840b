"""People of a tenant for tests: a member with a role, a password and an all-scopes API key, and
clients signed in as them (the fixtures alice, bob and carol in tests/conftest.py are made here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework.test import APIClient

from tenants import services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Tenant
from tests.support.scoping import in_tenant

ALL_SCOPES = ["ingest", "gate", "read", "recovery", "audit", "control"]


PASSWORD = "correct-horse-battery"


@dataclass
class Person:
    user: Any
    tenant: Tenant
    role: str
    api_key: str

    def session_client(self) -> APIClient:
        client = APIClient()
        client.force_login(self.user)
        client.credentials(HTTP_X_SAGAPLANE_TENANT=self.tenant.slug)
        return client

    def key_client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.api_key}")
        return client


def make_person(tenant: Tenant, name: str, role: str) -> Person:
    membership = in_tenant(
        services.add_member,
        tenant,
        f"{name}@{tenant.slug}.example",
        role,
        PASSWORD,
        actor=named_actor("test"),
    )
    _, raw_key = in_tenant(
        services.create_api_key,
        tenant,
        NewApiKey(name=f"{name}-agent", scopes=ALL_SCOPES),
        actor=named_actor("test"),
    )
    return Person(membership.user, tenant, role, raw_key)


def scoped_key_client(tenant: Tenant, *scopes: str) -> APIClient:
    """A client presenting a new API key of `tenant`'s with exactly `scopes` (none: a key that may
    do nothing)."""
    _, raw = in_tenant(
        services.create_api_key,
        tenant,
        NewApiKey(name="-".join(scopes) or "none", scopes=list(scopes)),
        actor=named_actor("test"),
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def outstanding_lease(tenant: Tenant, saga_id: str) -> str:
    """An outstanding budget lease of `tenant`'s that grants nothing (a ledger row: its id is what
    a holder presents when it gives the lease back), made once per saga id."""
    from datetime import timedelta

    from django.utils import timezone

    from core.scoping import tenant_context
    from fleet.models import GateLease

    with tenant_context(tenant):
        lease = GateLease.objects.filter(saga_id=saga_id).first() or GateLease.objects.create(
            saga_id=saga_id, tool="sample.pay", granted_ms=0, expires_at=timezone.now() + timedelta(hours=1)
        )
    return str(lease.pk)


def open_reservation(tenant: Tenant, saga_id: str) -> str:
    """An open reservation of `tenant`'s that reserved nothing (an allow's ledger row: its id is
    what the agent presents when it settles), made once per saga id."""
    from core.scoping import tenant_context
    from fleet.models import Decision, GateDecision

    with tenant_context(tenant):
        row = GateDecision.objects.filter(saga_id=saga_id).first() or GateDecision.objects.create(
            idempotency_key=f"reservation-{saga_id}",
            saga_id=saga_id,
            step_id="1",
            tool="sample.pay",
            args_digest="0" * 64,
            decision=Decision.ALLOW,
            detail={"reservation": {"state": "open", "reserved": 0, "store_ms": 0}},
        )
    return str(row.pk)
