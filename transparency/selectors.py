"""Read-only questions about the transparency log, for the pages (which never query
`transparency.models` themselves). Every query runs under the active tenant (TenantScopedModel)."""

from __future__ import annotations

import uuid

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
