"""The fleet's periodic work."""

from __future__ import annotations

from celery import shared_task

from core.scoping import tenant_context
from fleet import services
from tenants.models import Tenant


@shared_task(name="fleet.prune_denials")
def prune_denials() -> int:
    """Every tenant's refusals older than the retention go (allows, the ledger, stay forever), each
    tenant entered in turn (one transaction each)."""
    pruned = 0
    for tenant in Tenant.objects.order_by("pk").iterator():
        with tenant_context(tenant):
            pruned += services.prune_denials(tenant)
    return pruned


@shared_task(name="fleet.settle_expired_leases", ignore_result=True)
def settle_expired_leases() -> int:
    """Every tenant's budget leases that expired unreturned, settled (ARCHITECTURE §8.3). Run every
    second by the beat process' sweep thread (recovery/sweeper.py) through
    `services.settle_all_expired_leases`, never by a message a busy queue could starve; still a
    task, so an operator can run one pass by hand."""
    return services.settle_all_expired_leases()
