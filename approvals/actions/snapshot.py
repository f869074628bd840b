"""The enabled approval policies of a tenant, as the gate reads them on every call."""

from __future__ import annotations

from approvals.models import ApprovalPolicy
from core.snapshots import SnapshotCache
from tenants.models import Tenant

# The enabled policies of a tenant, read once and reused while its epoch stands (a policy change
# bumps it; `core.snapshots`, as the gate's own policy snapshot): every gate call asks, and most
# tenants' policies rarely change. Inside a gate decision the epoch is the one it read.
_SNAPSHOTS: SnapshotCache[list[ApprovalPolicy]] = SnapshotCache()


def enabled_policies(tenant: Tenant) -> list[ApprovalPolicy]:
    return _SNAPSHOTS.get(tenant, lambda: list(ApprovalPolicy.objects.filter(enabled=True).order_by("pk")))


def forget_policies(tenant: Tenant) -> None:
    _SNAPSHOTS.forget(tenant)
