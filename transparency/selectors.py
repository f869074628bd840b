"""Read-only questions about the transparency log, for the pages (which never query
`transparency.models` themselves). Every query runs under the active tenant (TenantScopedModel)."""

from __future__ import annotations

import uuid
from datetime import datetime

from audit.models import Record, TenantLog
from core.scoping import require_tenant
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


def integration_backlog(tenant: Tenant) -> tuple[int, datetime | None] | None:
    """The tenant's accepted leaves not yet under a signed checkpoint: (how many, when the oldest
    of them was accepted), or None when every leaf is signed. Three indexed lookups, in the
    tenant the caller entered (/metrics walks the tenants `tenants_to_integrate` names)."""
    require_tenant(tenant)
    size = TenantLog.objects.values_list("size", flat=True).first() or 0
    signed = Checkpoint.objects.order_by("-size").values_list("size", flat=True).first() or 0
    if size <= signed:
        return None
    oldest = Record.objects.filter(leaf_index=signed).values_list("received_at", flat=True).first()
    return size - signed, oldest


def tenants_to_integrate() -> list[int]:
    """Ids of tenants whose log has leaves not yet in a signed checkpoint (cross-tenant)."""
    return services.tenants_to_integrate()
