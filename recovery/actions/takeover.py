"""Taking over sagas whose lease expired: the sweep's pass over a tenant, and workers' claims
taking over their own tenant's expired leases (neither behind a queue)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.db.models import F, Q
from django.utils import timezone

from audit.services import (
    flush_server_records,
)
from core.scoping import tenant_context
from recovery import queries
from recovery.actions.common import SYSTEM_ACTOR, claimable, quarantined_out
from recovery.actions.runs import RunRequest, escalate, start_runs
from recovery.actions.webhooks import enqueue_delivery
from recovery.models import (
    UNFINISHED_RUN_STATES,
    Delivery,
    Escalation,
    Job,
    JobState,
    Lease,
    LeaseState,
    Run,
    RunKind,
)
from sagas import selectors as saga_selectors
from sagas.models import TERMINAL_STATUSES
from tenants.models import Tenant

log = logging.getLogger(__name__)

SWEEP_BATCH = 2000  # sagas taken over per tenant per sweep
TAKEOVER_BATCH = 250  # sagas per transaction
EVIDENCE_STALE_S = 0.5  # pending that long: left behind, the sweep chains it


def sweep(tenant: Tenant, *, now: datetime | None = None, limit: int = SWEEP_BATCH) -> dict[str, int]:
    """One pass for one tenant: take over sagas whose lease expired with no terminal record
    (quarantined ones are skipped), escalate jobs whose workers kept dying, and wake webhook
    deliveries that are due (`take_over_expired` does the first part, as workers' claims do).
    `now` (tests) fixes the clock for the whole pass."""
    taken = take_over_expired(tenant, now=now, limit=limit)
    now = now or timezone.now()
    with tenant_context(tenant):
        exhausted = list(
            Job.objects.filter(
                state=JobState.CLAIMED, lease_expires_at__lt=now, attempts__gte=F("max_attempts")
            ).select_for_update(skip_locked=True)[:limit]
        )
        for job in exhausted:
            escalate(
                tenant,
                job,
                Escalation.RETRIES_EXHAUSTED,
                f"its worker lost the lease on each of {job.attempts} attempts",
                actor=SYSTEM_ACTOR,
            )
        unclaimed = _escalate_unclaimed(tenant, now, limit)
        due_hooks = list(claimable(now, Delivery.WEBHOOK).values_list("pk", flat=True)[:limit])
    for job_id in due_hooks:
        enqueue_delivery(tenant.pk, job_id)
    # Last (takeovers first): results' evidence left pending (its appender died after its commit,
    # or no result came after it), not what is in flight.
    flush_server_records(tenant, wait=True, before=now.timestamp() - EVIDENCE_STALE_S)
    return {"taken_over": taken, "escalated": len(exhausted) + unclaimed, "webhooks_woken": len(due_hooks)}


def take_over_expired(
    tenant: Tenant, *, now: datetime | None = None, limit: int = SWEEP_BATCH, exclusive: bool = False
) -> int:
    """Take over the tenant's sagas whose lease expired (quarantined ones are left alone),
    TAKEOVER_BATCH at a time, each batch in its own transaction (a savepoint inside a caller's),
    so workers start on the first batch while the next is queued; each batch takes the leases
    expired by the time it starts. The leases are locked `SKIP LOCKED` (on SQLite every write
    transaction is IMMEDIATE, so takers run one after another), so two takers never take one
    saga. `exclusive` (a worker's claim): only while no one else is taking this tenant's leases
    over (`queries.takeover_turn`), never waiting for them. `now` (tests) fixes the clock."""
    taken = 0
    while taken < limit:
        moment = now or timezone.now()
        with tenant_context(tenant):
            if exclusive and not queries.takeover_turn(tenant):
                break
            leases = list(
                quarantined_out(Lease.objects.filter(state=LeaseState.LIVE, expires_at__lt=moment))
                .order_by("expires_at")
                .select_for_update(skip_locked=True)[: min(TAKEOVER_BATCH, limit - taken)]
            )
            if not leases:
                break
            _take_over(tenant, leases, moment)
        taken += len(leases)
    return taken


# A claim looks for expired leases at most this often per tenant and process (one indexed
# EXISTS), and takes over at most CLAIM_TAKEOVER_BATCH sagas (the sweep takes the rest).
CLAIM_TAKEOVER_EVERY_S = 0.5
CLAIM_TAKEOVER_BATCH = 50
_takeover_looked: dict[int, float] = {}


def take_over_on_claim(tenant: Tenant) -> int:
    """A worker's claim takes over its tenant's expired leases itself, before it picks a job, so
    the jobs it creates are claimable by the same claim: takeover needs neither the sweep nor a
    Celery worker, only a claimer (the sweep still runs for tenants with none: webhooks, sagas
    with no handler). Failure only logs: the claim goes on, the sweep will take them."""
    clock = time.monotonic()
    if clock - _takeover_looked.get(tenant.pk, -CLAIM_TAKEOVER_EVERY_S) < CLAIM_TAKEOVER_EVERY_S:
        return 0
    _takeover_looked[tenant.pk] = clock
    try:
        with tenant_context(tenant):
            due = Lease.objects.filter(state=LeaseState.LIVE, expires_at__lt=timezone.now()).exists()
        if not due:
            return 0
        return take_over_expired(tenant, limit=CLAIM_TAKEOVER_BATCH, exclusive=True)
    except DatabaseError:
        log.exception("a claim's takeover for tenant %s failed; the sweep takes them over", tenant.pk)
        return 0


def unclaimed_after() -> timedelta:
    from django.conf import settings

    return timedelta(seconds=settings.SAGAPLANE_RECOVERY_UNCLAIMED_SECONDS)


def _escalate_unclaimed(tenant: Tenant, now: datetime, limit: int) -> int:
    """Jobs for SDK workers that none claimed within SAGAPLANE_RECOVERY_UNCLAIMED_SECONDS of
    becoming claimable go to the human queue as `no_handler`, unless a worker took a job of the
    same handler meanwhile (then it is a queue, not a missing handler)."""
    cutoff = now - unclaimed_after()
    stale = list(
        claimable(now, Delivery.WORKER)
        .filter(state=JobState.PENDING, first_claimed_at__isnull=True, available_at__lt=cutoff)
        .select_for_update(skip_locked=True, of=("self",))[:limit]
    )
    if not stale:
        return 0
    served = set(
        Job.objects.filter(handler__in={job.handler for job in stale})
        .filter(Q(state=JobState.CLAIMED) | Q(first_claimed_at__gte=cutoff) | Q(finished_at__gte=cutoff))
        .exclude(state__in=[JobState.RESOLVED, JobState.CANCELLED])
        .values_list("handler", flat=True)
        .distinct()
    )
    seconds = f"{unclaimed_after().total_seconds():g}"
    escalated = 0
    for job in stale:
        if job.handler in served:
            continue
        detail = (
            f"no worker claimed it within {seconds} s: no SDK worker runs handler {job.handler!r} "
            "and no webhook takes it"
        )
        job.last_error = detail
        job.save(update_fields=["last_error"])
        escalate(tenant, job, Escalation.NO_HANDLER, detail, actor=SYSTEM_ACTOR)
        escalated += 1
    return escalated


def _take_over(tenant: Tenant, leases: list[Lease], now: datetime) -> None:
    """The leases are locked: mark them swept and start a crash run for each saga that is neither
    finished nor already being rolled back (to a step a person chose)."""
    saga_ids = [lease.saga_id for lease in leases]
    Lease.objects.filter(pk__in=[lease.pk for lease in leases]).update(state=LeaseState.SWEPT, swept_at=now)
    busy = set(
        Run.objects.filter(saga_id__in=saga_ids, state__in=UNFINISHED_RUN_STATES).values_list(
            "saga_id", flat=True
        )
    )
    found = saga_selectors.sagas_with_steps([s for s in saga_ids if s not in busy])
    requests = []
    for lease in leases:
        pair = found.get(lease.saga_id)
        if pair is not None and pair[0].status not in TERMINAL_STATUSES:
            requests.append(RunRequest(pair[0], pair[1], RunKind.CRASH, 0, lease.expires_at))
    start_runs(tenant, requests, actor=SYSTEM_ACTOR)
