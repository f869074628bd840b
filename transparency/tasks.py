"""The integrator and the export builder, as Celery tasks (embedded mode too:
`celery -A controlplane worker -B` on the filesystem broker runs both and the 1 s beat)."""

from __future__ import annotations

import logging

from celery import shared_task

from tenants.models import Tenant
from tenants.scoping import tenant_context
from transparency import services
from transparency.models import TreeState

log = logging.getLogger(__name__)


def _integrated_size(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return TreeState.objects.values_list("size", flat=True).first() or 0


@shared_task(name="transparency.integrate_tenant", ignore_result=True)
def integrate_tenant(tenant_id: int) -> int:
    """Integrate the tenant's new leaves, sign, then seal sagas that the new leaves finished
    (the seals are leaves too; the next round integrates them). Returns the signed size."""
    tenant = Tenant.objects.get(pk=tenant_id)
    before = _integrated_size(tenant)
    try:
        services.integrate_fully(tenant)
    except services.IntegrationRefused:
        # Never sign what cannot be proven; this needs a human, loudly.
        log.critical("transparency log of tenant %s: integration refused", tenant.slug, exc_info=True)
        raise
    after = _integrated_size(tenant)
    if after > before and services.seal_terminal_sagas(tenant, before, after):
        services.integrate_fully(tenant)  # sign the seals now rather than on the next tick
        after = _integrated_size(tenant)
    return after


@shared_task(name="transparency.integrate_grown_tenants", ignore_result=True)
def integrate_grown_tenants() -> list[int]:
    """Beat, every second: each tenant whose log has unintegrated leaves."""
    tenant_ids = services.tenants_to_integrate()
    for tenant_id in tenant_ids:
        try:
            integrate_tenant(tenant_id)
        except services.IntegrationRefused:
            continue  # logged; the other tenants still get their checkpoints
    return tenant_ids


@shared_task(name="transparency.build_export", ignore_result=True)
def build_export(export_id: str, tenant_id: int) -> None:
    services.build_export(Tenant.objects.get(pk=tenant_id), export_id)
