"""Read-only questions about the transparency log, for the pages (which never query
`transparency.models` themselves). Every query runs under the active tenant (TenantScopedModel)."""

from __future__ import annotations

import uuid
from datetime import datetime

from audit.models import Record, TenantLog
from core.scoping import tenant_context
from tenants.models import Tenant
from transparency import proofs, services
from transparency.models import Checkpoint, Export


def latest_checkpoint() -> Checkpoint | None:
    return proofs.latest_checkpoint()


def verifier_keys() -> list[str]:
    """Verifier key strings, active first (retired keys left out)."""
    return services.current_verifier_keys()


def recent_exports(limit: int) -> list[Export]:
    return list(Export.objects.order_by("-created_at")[:limit])


def export(export_id: uuid.UUID) -> Export | None:
    """The active tenant's export of that id (another tenant's is simply not found)."""
    return Export.objects.filter(pk=export_id).first()


def integration_lag() -> list[tuple[int, int, datetime | None]]:
    """For each tenant whose log has accepted leaves not yet under a signed checkpoint: (tenant
    id, how many, when the oldest of them was accepted). Across tenants, for /metrics: the one
    cross-tenant question is asked through the integrator's own function, then each tenant is
    read inside its context (three indexed lookups each)."""
    backlog: list[tuple[int, int, datetime | None]] = []
    for tenant_id in services.tenants_to_integrate():
        tenant = Tenant.objects.filter(pk=tenant_id).first()
        if tenant is None:
            continue
        with tenant_context(tenant):
            size = TenantLog.objects.values_list("size", flat=True).first() or 0
            signed = Checkpoint.objects.order_by("-size").values_list("size", flat=True).first() or 0
            if size <= signed:
                continue
            oldest = Record.objects.filter(leaf_index=signed).values_list("received_at", flat=True).first()
        backlog.append((tenant_id, size - signed, oldest))
    return backlog
