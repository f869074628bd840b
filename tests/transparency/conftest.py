"""Real chained records through the real ingest service (audit.services.ingest)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from sagaplane.chain import GENESIS, stamp

from audit import services as audit_services
from tenants.models import Tenant
from transparency import services


@dataclass
class Writer:
    """One agent's stream: appends chained records and ships them through ingest."""

    tenant: Tenant
    stream_id: str
    head: str = GENESIS
    seq: int = 0
    shipped: list[dict[str, Any]] = field(default_factory=list)

    def records(self, *items: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for event, fields in items:
            self.seq += 1
            record = {"seq": self.seq, "ts": round(time.time(), 6), "event": event, **fields}
            self.head = stamp(record, self.head)
            out.append(record)
        return out

    def ship(self, *items: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        batch = self.records(*items)
        audit_services.ingest(self.tenant, self.stream_id, batch, actor="test")
        self.shipped.extend(batch)
        return batch

    def saga(
        self, saga_id: str, *, steps: int = 2, end: str | None = "SAGA_COMPLETE"
    ) -> list[dict[str, Any]]:
        items: list[tuple[str, dict[str, Any]]] = [("SAGA_START", {"saga_id": saga_id, "name": saga_id})]
        for n in range(steps):
            step = {
                "saga_id": saga_id,
                "step_id": f"{saga_id}-s{n}",
                "tool": "payments.charge",
                "kwargs": {"amount": 10 + n},
            }
            items += [("STEP_INTENT", step), ("STEP_COMMITTED", step)]
        if end:
            items.append((end, {"saga_id": saga_id}))
        return self.ship(*items)


@pytest.fixture
def writer_a(tenant_a: Tenant) -> Writer:
    return Writer(tenant_a, "agent-a-1")


@pytest.fixture
def writer_b(tenant_b: Tenant) -> Writer:
    return Writer(tenant_b, "agent-b-1")


def seal_records(tenant: Tenant) -> list[tuple[str, int]]:
    """The tenant's SAGA_SEALED records, (saga id, leaf index), in log order."""
    from audit.models import Record
    from tenants.scoping import tenant_context

    with tenant_context(tenant):
        return list(
            Record.objects.filter(event=services.SEAL_EVENT)
            .order_by("leaf_index")
            .values_list("saga_id", "leaf_index")
        )


def seal_watermark(tenant: Tenant) -> int:
    """The tenant's seal watermark (0 before its first seal pass)."""
    from tenants.scoping import tenant_context
    from transparency.models import SealState

    with tenant_context(tenant):
        return SealState.objects.values_list("sealed_size", flat=True).first() or 0


def settle(tenant: Tenant) -> None:
    """What the two workers do after ingest: the sealer seals finished sagas, the integrator
    integrates records and seals and signs them."""
    from transparency.tasks import integrate_tenant, seal_tenant

    seal_tenant(tenant.pk)
    integrate_tenant(tenant.pk)
    assert services.tenants_to_integrate() == [] or tenant.pk not in services.tenants_to_integrate()
