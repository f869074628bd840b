"""The sweep's one question across tenants: which tenants have recovery work due now (a live
lease that expired, a claimed job whose lease ran out, a webhook delivery that is due). Tenant ids
only; the sweep then works inside each tenant with `tenant_context`. On Postgres a SECURITY
DEFINER function owned by the owner role (tenants/rls.py); on SQLite the same through the ORM."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q

from recovery.models import Delivery, Job, JobState, Lease, LeaseState
from tenants import rls
from tenants.scoping import dangerously_bypass_orm_scope

_TENANTS_WITH_RECOVERY_DUE = rls.cross_tenant_function(
    "sagaplane_tenants_with_recovery_due",
    arguments="due_at timestamptz",
    returns="TABLE (tenant_id bigint)",
    body=(
        f"SELECT tenant_id FROM {Lease._meta.db_table} "
        f"WHERE state = '{LeaseState.LIVE.value}' AND expires_at < due_at "
        "UNION "
        f"SELECT tenant_id FROM {Job._meta.db_table} "
        f"WHERE (state = '{JobState.CLAIMED.value}' AND lease_expires_at < due_at) "
        f"OR (state = '{JobState.PENDING.value}' AND delivery = '{Delivery.WEBHOOK.value}' "
        "AND available_at <= due_at) "
        "ORDER BY tenant_id"
    ),
)


def tenants_with_recovery_due(now: datetime) -> list[int]:
    if rls.enforces_rls():
        return [tenant_id for (tenant_id,) in _TENANTS_WITH_RECOVERY_DUE.rows(now)]
    with dangerously_bypass_orm_scope():
        leases = Lease.objects.filter(state=LeaseState.LIVE, expires_at__lt=now).values_list(
            "tenant_id", flat=True
        )
        jobs = Job.objects.filter(
            Q(state=JobState.CLAIMED, lease_expires_at__lt=now)
            | Q(state=JobState.PENDING, delivery=Delivery.WEBHOOK, available_at__lte=now)
        ).values_list("tenant_id", flat=True)
        return sorted(set(leases) | set(jobs))
