"""Workers' side of a job: claims (a conditional UPDATE raising the job's fencing token, its
`epoch`), the holder's heartbeat, and the checks of a token a result carries."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from core.claims import Increment, Leased, SetIfNull
from core.claims import claim as claim_rows
from core.errors import DomainError
from core.scoping import require_tenant
from recovery.actions.common import DEFAULT_JOB_LEASE_S, claimable
from recovery.actions.takeover import take_over_on_claim
from recovery.inputs import LeaseExtension
from recovery.models import (
    Delivery,
    Job,
    JobState,
)
from tenants.models import Tenant


def claim(
    tenant: Tenant,
    *,
    worker: str,
    handlers: Sequence[str] | None,
    lease_s: float = DEFAULT_JOB_LEASE_S,
    delivery: str = Delivery.WORKER,
    job_id: uuid.UUID | str | None = None,
) -> Job | None:
    """Take the next job this claimer can run (one of `handlers`; any when None), raising its
    fencing token; None when there is none."""
    jobs = claim_many(
        tenant, worker=worker, handlers=handlers, lease_s=lease_s, delivery=delivery, job_id=job_id
    )
    return jobs[0] if jobs else None


# The job's lease (core.claims): a claim takes a pending job, or a claimed one whose lease ran out.
JOBS = Leased(
    Job,
    state="state",
    claimed=JobState.CLAIMED,
    claimable=(JobState.PENDING, JobState.CLAIMED),
    token="epoch",
    holder="claimed_by",
    lease="lease_expires_at",
)


def claim_many(
    tenant: Tenant,
    *,
    worker: str,
    handlers: Sequence[str] | None,
    lease_s: float = DEFAULT_JOB_LEASE_S,
    max_jobs: int = 1,
    delivery: str = Delivery.WORKER,
    job_id: uuid.UUID | str | None = None,
) -> list[Job]:
    """Take up to `max_jobs` (default 1) jobs this claimer can run, in one statement
    (`core.claims.claim`): the candidates (`claimable`) are locked (`SKIP LOCKED` on Postgres)
    and claimed by one conditional UPDATE guarded by each one's fencing token as picked, which
    it raises, setting the lease. A run has one job at its frontier, so a batch never holds two
    jobs of one saga: newest first still holds."""
    require_tenant(tenant)  # its one write is its only statement: no savepoint of its own
    if job_id is None:
        take_over_on_claim(tenant)
    names = None if handlers is None else list(handlers)
    wanted = None if job_id is None else uuid.UUID(str(job_id))

    def candidates(now: datetime) -> QuerySet[Job]:
        ready = claimable(now, delivery)
        if names is not None:
            ready = ready.filter(handler__in=names)
        if wanted is not None:
            ready = ready.filter(pk=wanted)
        return ready.order_by("available_at", "created_at")

    now = timezone.now()
    return claim_rows(
        JOBS,
        candidates,
        now=now,
        holder=worker,
        lease_until=now + timedelta(seconds=lease_s),
        limit=max_jobs,
        shape=(tenant.pk, str(delivery), None if names is None else tuple(names), wanted),
        also={"attempts": Increment(), "first_claimed_at": SetIfNull(now)},
    )


def held(job_id: Any, token: int) -> Job:
    """The job, locked, if `token` is its current fencing token and it is still claimed."""
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        raise DomainError("not_found", "no such recovery job", status=404)
    if not JOBS.holds(job, token):
        raise stale(token)
    return job


def heartbeat(tenant: Tenant, job_id: Any, extension: LeaseExtension) -> Job:
    """Extend the holder's lease (a long compensation)."""
    require_tenant(tenant)  # its one write is its last statement: no savepoint of its own
    job = held(job_id, extension.token)
    job.lease_expires_at = timezone.now() + timedelta(seconds=extension.lease_s)
    job.save(update_fields=["lease_expires_at"])
    return job


def stale(token: Any) -> DomainError:
    return DomainError(
        "stale_token",
        f"this job's current token is not {token} (it was claimed again, or already finished): "
        "nothing was recorded",
        status=409,
        field="token",
    )
