"""The sweep's one question across tenants: which tenants have recovery work due now (a live
lease that expired, a claimed job whose lease ran out, a webhook delivery that is due, a result's
server record left pending by an appender that died). Tenant ids
only; the sweep then works inside each tenant with `tenant_context`. And /metrics' one question:
how many jobs wait for a worker, are claimed, or wait for a human (escalated: the human queue),
all tenants together (counts only). On Postgres SECURITY DEFINER functions owned by the owner role
(core/rls.py); on SQLite the same through the ORM."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Q

from audit.models import PendingServerRecord
from core import rls
from core.scoping import dangerously_bypass_orm_scope
from recovery.models import Delivery, Job, JobState, Lease, LeaseState

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
        "UNION "
        f"SELECT tenant_id FROM {PendingServerRecord._meta.db_table} "
        "ORDER BY tenant_id"
    ),
)


_TENANTS_WITH_UNCLAIMED_JOBS = rls.cross_tenant_function(
    "sagaplane_tenants_with_unclaimed_recovery_jobs",
    arguments="before timestamptz",
    returns="TABLE (tenant_id bigint)",
    body=(
        f"SELECT DISTINCT tenant_id FROM {Job._meta.db_table} "
        f"WHERE state = '{JobState.PENDING.value}' AND delivery = '{Delivery.WORKER.value}' "
        "AND first_claimed_at IS NULL AND available_at < before ORDER BY tenant_id"
    ),
)


def tenants_with_unclaimed_jobs(before: datetime) -> list[int]:
    """Tenants with a job for SDK workers, never claimed, claimable since before `before` (the
    sweep escalates those no worker serves)."""
    if rls.enforces_rls():
        return [tenant_id for (tenant_id,) in _TENANTS_WITH_UNCLAIMED_JOBS.rows(before)]
    with dangerously_bypass_orm_scope():
        return sorted(
            set(
                Job.objects.filter(
                    state=JobState.PENDING,
                    delivery=Delivery.WORKER,
                    first_claimed_at__isnull=True,
                    available_at__lt=before,
                ).values_list("tenant_id", flat=True)
            )
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
        pending = PendingServerRecord.objects.values_list("tenant_id", flat=True)
        return sorted(set(leases) | set(jobs) | set(pending))


# Counted through the (state, lease_expires_at) index; the finished states are left out.
_QUEUED = (JobState.PENDING, JobState.CLAIMED, JobState.ESCALATED)

_RECOVERY_QUEUE_DEPTHS = rls.cross_tenant_function(
    "sagaplane_recovery_queue_depths",
    arguments="",
    returns="TABLE (job_state text, depth bigint)",
    body=(
        f"SELECT state::text, count(*) FROM {Job._meta.db_table} "
        f"WHERE state IN ({', '.join(repr(state.value) for state in _QUEUED)}) GROUP BY state"
    ),
)


def queue_depths() -> dict[str, int]:
    """recovery_pending (waiting for a worker or a webhook delivery), recovery_claimed (held by a
    worker), recovery_escalated (the human queue), all tenants together; a state with no job is 0."""
    if rls.enforces_rls():
        counts = dict(_RECOVERY_QUEUE_DEPTHS.rows())
    else:
        with dangerously_bypass_orm_scope():
            counts = {
                row["state"]: row["depth"]
                for row in Job.objects.filter(state__in=_QUEUED)
                .values("state")
                .annotate(depth=Count("id"))
                .order_by()
            }
    return {f"recovery_{state.value}": int(counts.get(state.value, 0)) for state in _QUEUED}
