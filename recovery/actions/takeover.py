"""Taking over sagas whose lease expired: the sweep's pass over a tenant, and workers' claims
taking over their own tenant's expired leases (neither behind a queue)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import F, Q
from django.utils import timezone

from core.scoping import require_tenant
from recovery import queries
from recovery.actions.common import SYSTEM_ACTOR, claimable, quarantined_out
from recovery.actions.runs import RunRequest, escalate, start_runs
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


def escalate_due(tenant: Tenant, *, now: datetime, limit: int = SWEEP_BATCH) -> tuple[int, list[Any]]:
    """The sweep's second part, in the caller's transaction as the tenant (asserted): escalate jobs
    whose workers kept dying and jobs no SDK worker claimed (`_escalate_unclaimed`). Returns how
    many it escalated and the ids of the webhook deliveries now due, for the caller to wake once
    this has committed (recovery.tasks.sweep_tenant, the transport)."""
    require_tenant(tenant)
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
    return len(exhausted) + unclaimed, due_hooks


def take_over_batch(
    tenant: Tenant, *, now: datetime | None = None, limit: int = TAKEOVER_BATCH, exclusive: bool = False
) -> int:
    """Take over up to `limit` of the tenant's sagas whose lease expired by `now` (quarantined ones
    are left alone), in the caller's transaction as the tenant (asserted); how many it took. The
    leases are locked `SKIP LOCKED` (on SQLite every write transaction is IMMEDIATE, so takers run
    one after another), so two takers never take one saga. `exclusive` (a worker's claim): only
    while no one else is taking this tenant's leases over (`queries.takeover_turn`), never
    waiting for them. The sweep (recovery.tasks.sweep_tenant) commits each batch on its own, so
    workers start on the first while the next is taken."""
    require_tenant(tenant)
    moment = now or timezone.now()
    if exclusive and not queries.takeover_turn(tenant):
        return 0
    leases = list(
        quarantined_out(Lease.objects.filter(state=LeaseState.LIVE, expires_at__lt=moment))
        .order_by("expires_at")
        .select_for_update(skip_locked=True)[:limit]
    )
    if leases:
        _take_over(tenant, leases, moment)
    return len(leases)


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
    require_tenant(tenant)
    try:
        # A savepoint: a failed takeover leaves the claim's transaction able to go on.
        with transaction.atomic():
            due = Lease.objects.filter(state=LeaseState.LIVE, expires_at__lt=timezone.now()).exists()
            if not due:
                return 0
            return take_over_batch(tenant, limit=CLAIM_TAKEOVER_BATCH, exclusive=True)
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
