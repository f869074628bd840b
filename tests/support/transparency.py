"""What the transparency workers do after ingest, run in the test's process, and what they leave."""

from __future__ import annotations

from tenants.models import Tenant
from transparency import services


def seal_records(tenant: Tenant) -> list[tuple[str, int]]:
    """The tenant's SAGA_SEALED records, (saga id, leaf index), in log order."""
    from audit.models import Record
    from core.scoping import tenant_context

    with tenant_context(tenant):
        return list(
            Record.objects.filter(event=services.SEAL_EVENT)
            .order_by("leaf_index")
            .values_list("saga_id", "leaf_index")
        )


def seal_watermark(tenant: Tenant) -> int:
    """The tenant's seal watermark (0 before its first seal pass)."""
    from core.scoping import tenant_context
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
