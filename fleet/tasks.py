"""The fleet's periodic work."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from fleet import services
from fleet.cross_tenant import tenants_with_leases_due
from tenants.models import Tenant

log = logging.getLogger(__name__)


@shared_task(name="fleet.prune_denials")
def prune_denials() -> int:
    """Every tenant's refusals older than the retention go (allows, the ledger, stay forever)."""
    return sum(services.prune_denials(tenant) for tenant in Tenant.objects.order_by("pk").iterator())


@shared_task(name="fleet.settle_expired_leases", ignore_result=True)
def settle_expired_leases() -> int:
    """Every tenant's budget leases that expired unreturned, settled at what their holders'
    shipped WALs prove used (ARCHITECTURE §8.3). Run every second by the beat process' sweep
    thread (recovery/sweeper.py), never by a message a busy queue could starve; still a task, so
    an operator can run one pass by hand."""
    settled = 0
    for tenant_id in tenants_with_leases_due(timezone.now()):
        tenant = Tenant.objects.filter(pk=tenant_id).first()
        if tenant is None:
            continue
        try:
            settled += services.settle_expired_leases(tenant)
        except Exception:
            log.exception("lease settlement of tenant %s failed; the next pass retries", tenant_id)
    return settled
