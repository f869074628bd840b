"""Workers' side of a job: claims (a conditional UPDATE raising the job's fencing token, its
`epoch`), the holder's heartbeat, and the checks of a token a result carries."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane.numbers import finite_number
from fleet import selectors as fleet_selectors
from recovery.actions.common import DEFAULT_JOB_LEASE_S, MAX_JOB_LEASE_S, RecoveryError, claimable
from recovery.actions.takeover import take_over_on_claim
from recovery.models import (
    Delivery,
    Job,
    JobState,
    Run,
    RunState,
)
from tenants.models import Tenant
from tenants.scoping import joined_tenant_context, tenant_context


def lease_seconds(value: Any) -> float:
    if value is None:
        return DEFAULT_JOB_LEASE_S
    if not finite_number(value) or not 1 <= value <= MAX_JOB_LEASE_S:
        raise RecoveryError(
            400, "invalid", f"lease_s: seconds from 1 to {MAX_JOB_LEASE_S:g}", field="lease_s"
        )
    return float(value)


MAX_CLAIM_BATCH = 100


def _claim_batch_size(value: Any) -> int:
    if value is None:
        return 1
    if type(value) is not int or not 1 <= value <= MAX_CLAIM_BATCH:
        raise RecoveryError(
            400, "invalid", f"max_jobs: an integer from 1 to {MAX_CLAIM_BATCH}", field="max_jobs"
        )
    return value


def check_claim_terms(*, lease_s: Any, max_jobs: Any) -> None:
    """Refuse a claim's malformed terms (400) before anything its request carries is recorded."""
    lease_seconds(lease_s)
    _claim_batch_size(max_jobs)


def claim(
    tenant: Tenant,
    *,
    worker: str,
    handlers: Sequence[str] | None,
    lease_s: Any = None,
    delivery: str = Delivery.WORKER,
    job_id: uuid.UUID | str | None = None,
) -> Job | None:
    """Take the next job this claimer can run (one of `handlers`; any when None), raising its
    fencing token; None when there is none."""
    jobs = claim_many(
        tenant, worker=worker, handlers=handlers, lease_s=lease_s, delivery=delivery, job_id=job_id
    )
    return jobs[0] if jobs else None


def claim_many(
    tenant: Tenant,
    *,
    worker: str,
    handlers: Sequence[str] | None,
    lease_s: Any = None,
    max_jobs: Any = None,
    delivery: str = Delivery.WORKER,
    job_id: uuid.UUID | str | None = None,
) -> list[Job]:
    """Take up to `max_jobs` (default 1) jobs this claimer can run, in one transaction: the
    candidates are locked (`SKIP LOCKED` on Postgres) and claimed by one conditional UPDATE that
    re-checks readiness, raises each one's fencing token and sets its lease. A run has one job at
    its frontier, so a batch never holds two jobs of one saga: newest first still holds."""
    seconds = lease_seconds(lease_s)
    limit = _claim_batch_size(max_jobs)
    if job_id is None:
        take_over_on_claim(tenant)
    with joined_tenant_context(tenant):  # its one write is its last statement
        now = timezone.now()
        expires = now + timedelta(seconds=seconds)
        name = worker[:200]
        if connection.vendor == "postgresql":
            return _claim_in_one_statement(
                tenant,
                name=name,
                handlers=handlers,
                delivery=delivery,
                job_id=job_id,
                limit=limit,
                now=now,
                expires=expires,
            )
        candidates = claimable(now, delivery)
        if handlers is not None:
            candidates = candidates.filter(handler__in=list(handlers))
        if job_id is not None:
            candidates = candidates.filter(pk=job_id)
        picked = list(
            candidates.order_by("available_at", "created_at")
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("pk", "epoch")[:limit]
        )
        if not picked:
            return []
        # Guarded by each row's epoch as picked (and a state a claim may leave): on Postgres the
        # rows are locked, on SQLite (no row locks) a claimer that took one of them a moment
        # earlier raised its epoch, and a holder that finished it changed its state, so this
        # claim takes nothing of those. (Re-testing the whole readiness query in the UPDATE costs
        # seconds a batch on Postgres: its joins and row-level security per row.)
        by_epoch: dict[int, list[Any]] = {}
        for pk, epoch in picked:
            by_epoch.setdefault(epoch, []).append(pk)
        guard = Q()
        for epoch, pks in by_epoch.items():
            guard |= Q(pk__in=pks, epoch=epoch)
        Job.objects.filter(guard, state__in=[JobState.PENDING, JobState.CLAIMED]).update(
            state=JobState.CLAIMED,
            epoch=F("epoch") + 1,
            claimed_by=name,
            lease_expires_at=expires,
            attempts=F("attempts") + 1,
            first_claimed_at=Coalesce("first_claimed_at", Value(now)),
        )
        epochs = {pk: epoch + 1 for pk, epoch in picked}
        taken = {
            job.pk: job
            for job in Job.objects.filter(
                pk__in=list(epochs), state=JobState.CLAIMED, claimed_by=name, lease_expires_at=expires
            )
            if job.epoch == epochs[job.pk]
        }
        return [taken[pk] for pk, _ in picked if pk in taken]


def _claim_in_one_statement(
    tenant: Tenant,
    *,
    name: str,
    handlers: Sequence[str] | None,
    delivery: str,
    job_id: uuid.UUID | str | None,
    limit: int,
    now: datetime,
    expires: datetime,
) -> list[Job]:
    """Postgres: pick (locked, `SKIP LOCKED`) and claim in one statement, `UPDATE ... FROM` the
    pick `RETURNING` the claimed rows: a worker running one job at a time pays one statement per
    claim instead of three (pick, claim, re-read), and no ORM compilation (building and compiling
    `claimable` cost more than running it). The pick is `claimable`'s readiness written out
    (the tests run both on both databases); the UPDATE's guard is the one the other databases
    use (each row's epoch as picked, a state a claim may leave)."""
    quote = connection.ops.quote_name
    quarantined, quarantine_params = fleet_selectors.quarantined_saga_ids_sql()
    conditions = [
        "j.tenant_id = %s",
        "((j.state = %s AND j.available_at <= %s) OR (j.state = %s AND j.lease_expires_at < %s))",
        "r.state = %s",
        "j.ordinal = r.frontier",
        "j.delivery = %s",
        "j.attempts < j.max_attempts",
        f"j.saga_id NOT IN ({quarantined})",
    ]
    params: list[Any] = [
        tenant.pk,
        JobState.PENDING,
        now,
        JobState.CLAIMED,
        now,
        RunState.ACTIVE,
        delivery,
        *quarantine_params,
    ]
    if handlers is not None:
        conditions.append("j.handler = ANY(%s)")
        params.append(list(handlers))
    if job_id is not None:
        conditions.append("j.id = %s")
        params.append(uuid.UUID(str(job_id)))
    table, runs = quote(Job._meta.db_table), quote(Run._meta.db_table)
    columns = ", ".join(f"j.{quote(str(f.column))}" for f in Job._meta.concrete_fields)
    claimed = list(
        Job.objects.raw(
            f"WITH picked AS (SELECT j.id, j.epoch FROM {table} j JOIN {runs} r ON r.id = j.run_id "
            f"WHERE {' AND '.join(conditions)} ORDER BY j.available_at, j.created_at LIMIT %s "
            "FOR UPDATE OF j SKIP LOCKED) "
            f"UPDATE {table} AS j SET state = %s, epoch = j.epoch + 1, claimed_by = %s, "
            "lease_expires_at = %s, attempts = j.attempts + 1, "
            "first_claimed_at = COALESCE(j.first_claimed_at, %s) "
            "FROM picked WHERE j.tenant_id = %s AND j.id = picked.id AND j.epoch = picked.epoch "
            f"AND j.state IN (%s, %s) RETURNING {columns}",
            [
                *params,
                limit,
                JobState.CLAIMED,
                name,
                expires,
                now,
                tenant.pk,
                JobState.PENDING,
                JobState.CLAIMED,
            ],
        )
    )
    return sorted(claimed, key=lambda job: (job.available_at, job.created_at))


def held(job_id: Any, token: Any) -> Job:
    """The job, locked, if `token` is its current fencing token and it is still claimed."""
    token_of(token)
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        raise RecoveryError(404, "not_found", "no such recovery job")
    if job.state != JobState.CLAIMED or job.epoch != token:
        raise stale(token)
    return job


def heartbeat(tenant: Tenant, job_id: Any, *, token: Any, lease_s: Any = None) -> Job:
    """Extend the holder's lease (a long compensation)."""
    seconds = lease_seconds(lease_s)
    with tenant_context(tenant):
        job = held(job_id, token)
        job.lease_expires_at = timezone.now() + timedelta(seconds=seconds)
        job.save(update_fields=["lease_expires_at"])
        return job


def stale(token: Any) -> RecoveryError:
    return RecoveryError(
        409,
        "stale_token",
        f"this job's current token is not {token} (it was claimed again, or already finished): "
        "nothing was recorded",
        field="token",
    )


def token_of(value: Any) -> int:
    if type(value) is not int:
        raise RecoveryError(400, "invalid", "token: the integer the claim returned", field="token")
    return value
