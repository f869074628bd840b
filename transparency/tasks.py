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
    """Integrate the tenant's new leaves and sign, then seal the sagas they finished (the seals
    are leaves too, so integrate and sign them at once). Sealing runs off the tenant's seal
    watermark, not this call's growth: a crash between signing and sealing is healed by the next
    call, which the beat makes (`integrate_grown_tenants`). Returns the signed size."""
    tenant = Tenant.objects.get(pk=tenant_id)
    try:
        services.integrate_fully(tenant)
        # At most two rounds: the seals' own leaves finish no saga, so the second seal pass only
        # moves the watermark over them.
        for _ in range(2):
            if not services.seal_pending(tenant):
                break
            services.integrate_fully(tenant)
    except services.IntegrationRefused:
        # Never sign what cannot be proven; this needs a human, loudly.
        log.critical("transparency log of tenant %s: integration refused", tenant.slug, exc_info=True)
        raise
    return _integrated_size(tenant)


@shared_task(name="transparency.integrate_grown_tenants", ignore_result=True)
def integrate_grown_tenants() -> list[int]:
    """Beat, every second: each tenant whose log has unintegrated leaves, or integrated leaves the
    seal pass has not covered yet (two indexed queries, no scan of sagas)."""
    tenant_ids = sorted(set(services.tenants_to_integrate()) | set(services.tenants_to_seal()))
    for tenant_id in tenant_ids:
        try:
            integrate_tenant(tenant_id)
        except services.IntegrationRefused:
            continue  # logged; the other tenants still get their checkpoints
    return tenant_ids


@shared_task(name="transparency.sweep_stale_exports", ignore_result=True)
def sweep_stale_exports() -> dict[str, list[str]]:
    """Beat: re-queue exports whose build went quiet (a worker died mid-build), fail them after
    SAGAPLANE_EXPORT_MAX_ATTEMPTS builds."""
    outcome = services.sweep_stale_exports()
    if outcome["requeued"] or outcome["failed"]:
        log.warning("stale exports: re-queued %s, failed %s", outcome["requeued"], outcome["failed"])
    return outcome


@shared_task(name="transparency.build_export", ignore_result=True)
def build_export(export_id: str, tenant_id: int) -> None:
    services.build_export(Tenant.objects.get(pk=tenant_id), export_id)
