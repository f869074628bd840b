"""The fleet's periodic work."""

from __future__ import annotations

from celery import shared_task

from fleet import services
from tenants.models import Tenant


@shared_task(name="fleet.prune_denials")
def prune_denials() -> int:
    """Every tenant's refusals older than the retention go (allows, the ledger, stay forever)."""
    return sum(services.prune_denials(tenant) for tenant in Tenant.objects.order_by("pk").iterator())
