"""The gate's lean path in tests: a decision asked outside any transaction (the lean path's
condition) and the tenant's ledger (the private Redis and its store: tests/fleet/conftest.py)."""

from __future__ import annotations

from typing import Any

from django.db import connection

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import GateDecision
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.support.scoping import in_statements

ACTOR = named_actor("test:lean")


def ask(tenant: Tenant, fields: dict[str, Any]) -> dict[str, Any]:
    assert not connection.in_atomic_block  # the lean path's condition
    return in_statements(services.evaluate, tenant, GateRequest(**fields), actor=ACTOR)


def ledger(tenant: Tenant) -> list[GateDecision]:
    with tenant_context(tenant):
        return list(GateDecision.objects.order_by("decided_at"))
