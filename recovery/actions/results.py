"""Workers' results: completions and failures recorded by the holder of a job's current
fencing token, alone or several in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from sagaplane.events import Event

from audit.services import (
    queue_server_records,
)
from core import timing
from core.actors import Actor
from core.errors import DomainError
from core.scoping import require_tenant
from recovery.actions.claims import JOBS, held, stale
from recovery.actions.runs import advance_runs, escalate
from recovery.inputs import Completion, Failure, JobResult
from recovery.models import (
    Escalation,
    Job,
    JobState,
    Run,
)
from tenants.models import Tenant

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0


def complete(tenant: Tenant, job_id: Any, completion: Completion, *, actor: Actor) -> Job:
    """Record a compensation as done, if the completion's token still holds the job (404 for no
    such job, 409 `stale_token` otherwise)."""
    require_tenant(tenant)  # refusals are answers, not exceptions: nothing to undo, no savepoint
    (outcome,) = complete_locked(tenant, [(job_id, completion.token)], actor=actor)
    if isinstance(outcome, DomainError):
        raise outcome
    return outcome


def complete_locked(
    tenant: Tenant, items: Sequence[tuple[Any, int]], *, actor: Actor
) -> list[Job | DomainError]:
    """Record several compensations as done in the caller's transaction: each (job id, token)
    whose token still holds its job is compensated, the others answer their error (404, 409
    `stale_token`) and record nothing. One UPDATE for the jobs, one for their runs, and one
    server-stream batch of COMPENSATED records (then one of ROLLBACK_END for the runs this
    finished)."""
    ids = [job_id for job_id, _ in items]
    with timing.phase("lock_jobs"):
        jobs = {job.pk: job for job in Job.objects.select_for_update().filter(pk__in=ids).order_by("pk")}
    outcomes: list[Job | DomainError] = []
    good: dict[Any, Job] = {}
    for job_id, token in items:
        job = jobs.get(job_id)
        if job is None:
            outcomes.append(DomainError("not_found", "no such recovery job", status=404))
        elif job.state == JobState.COMPENSATED and job.epoch == token:
            # A completion sent again with the token that recorded it (its answer was lost, or a
            # claim that carried it is retried): the same answer, nothing recorded twice.
            outcomes.append(job)
        elif not JOBS.holds(job, token) or job.pk in good:
            outcomes.append(stale(token))
        else:
            good[job.pk] = job
            outcomes.append(job)
    if not good:
        return outcomes
    with timing.phase("lock_runs"):
        runs = list(
            Run.objects.select_for_update()
            .filter(pk__in={job.run_id for job in good.values()})
            .order_by("pk")
        )
    now = timezone.now()
    with timing.phase("update_jobs"):
        Job.objects.filter(pk__in=list(good)).update(
            state=JobState.COMPENSATED, finished_at=now, lease_expires_at=None
        )
    records: list[tuple[str, dict[str, Any]]] = []
    for job in good.values():
        job.state = JobState.COMPENSATED
        job.finished_at = now
        job.lease_expires_at = None
        records.append(
            (
                Event.COMPENSATED,
                {
                    "saga_id": job.saga_id,
                    "step_id": job.step_id,
                    "tool": job.tool,
                    "handler": job.handler,
                    "idempotency_key": job.idempotency_key,
                    "attempts": job.attempts,
                    "job_id": str(job.pk),
                    "token": job.epoch,
                    "worker": job.claimed_by,
                    "delivery": job.delivery,
                },
            )
        )
    with timing.phase("advance_runs"):
        records += advance_runs(tenant, runs, now=now, defer=True)
    with timing.phase("evidence"):
        queue_server_records(tenant, records, actor=actor)
    return outcomes


def backoff(attempts: int) -> float:
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1)))


def fail(tenant: Tenant, job_id: Any, failure: Failure, *, actor: Actor) -> Job:
    """Record a failed attempt: retried after a backoff while attempts remain, else escalated.
    `reason="no_handler"` (the worker cannot run this handler) escalates at once."""
    message, reason = failure.error, failure.reason
    require_tenant(tenant)
    with transaction.atomic():  # a savepoint: report_many answers a refused failure and goes on
        job = held(job_id, failure.token)
        run = Run.objects.select_for_update().get(pk=job.run_id)
        final = reason is not None or not failure.retryable or job.attempts >= job.max_attempts
        job.last_error = message
        job.lease_expires_at = None
        evidence: list[tuple[str, dict[str, Any]]] = [
            (
                Event.COMPENSATION_FAILED,
                {
                    "saga_id": job.saga_id,
                    "step_id": job.step_id,
                    "tool": job.tool,
                    "handler": job.handler,
                    "idempotency_key": job.idempotency_key,
                    "error": message,
                    "attempts": job.attempts,
                    "final": final,
                    "job_id": str(job.pk),
                    "token": job.epoch,
                    "worker": job.claimed_by,
                },
            )
        ]
        if final:
            why = Escalation.NO_HANDLER if reason else Escalation.RETRIES_EXHAUSTED
            job.save(update_fields=["last_error", "lease_expires_at"])
            escalate(tenant, job, why, message, actor=actor, run=run, evidence=evidence)
        else:
            job.state = JobState.PENDING
            job.available_at = timezone.now() + timedelta(seconds=backoff(job.attempts))
            job.save(update_fields=["state", "available_at", "last_error", "lease_expires_at"])
        queue_server_records(tenant, evidence, actor=actor)
        return job


def report_many(tenant: Tenant, results: Sequence[JobResult], *, actor: Actor) -> list[Job | DomainError]:
    """Several results in one request and one transaction, in order (`RecoveryResults` judged
    them): completions are recorded together (`complete_locked`); each failure as `fail` records
    it. A result whose token no longer holds its job answers its error and records nothing."""
    outcomes: list[Job | DomainError | None] = [None] * len(results)
    # In the caller's transaction: each failure keeps a savepoint of its own (`fail`).
    require_tenant(tenant)
    done = [(i, result) for i, result in enumerate(results) if result.failure is None]
    if done:
        completed = complete_locked(tenant, [(r.job_id, r.token) for _, r in done], actor=actor)
        for (i, _), outcome in zip(done, completed, strict=True):
            outcomes[i] = outcome
    for i, result in enumerate(results):
        if result.failure is not None:
            try:
                outcomes[i] = fail(tenant, result.job_id, result.failure, actor=actor)
            except DomainError as exc:
                outcomes[i] = exc
    return [outcome for outcome in outcomes if outcome is not None]
