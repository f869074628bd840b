"""The reconciliation pass, as a Celery beat task (after recovery: it looks only at steps already
compensated, by their agent or by a recovery worker)."""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.celery import keep_going
from reconciliation import services
from tenants.models import Tenant

log = logging.getLogger(__name__)


@shared_task(name="reconciliation.reconcile", ignore_result=True)
def reconcile() -> dict[str, int]:
    """Every tenant with work: new compensations become checks, overdue checks unverifiable. One
    tenant's failure is logged and does not stop the others."""
    totals = {"tenants": 0, "created": 0, "expired": 0}
    for tenant_id in services.tenants_to_reconcile():
        if not keep_going():
            break
        tenant = Tenant.objects.filter(pk=tenant_id).first()
        if tenant is None:
            continue
        try:
            done = services.reconcile_tenant(tenant)
        except Exception:
            log.exception("reconciliation of tenant %s failed; the next tick tries again", tenant_id)
            continue
        totals["tenants"] += 1
        totals["created"] += done["created"]
        totals["expired"] += done["expired"]
    return totals
