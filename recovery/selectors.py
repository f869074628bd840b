"""Read-only questions about recovery, for the API, the pages and other apps (reconciliation
asks `compensations` which steps recovery compensated). Every query runs under the active tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from recovery.models import Job, JobState, Lease, LeaseState, Run, RunKind, RunState, Webhook
from sagas import selectors as saga_selectors
from sagas.models import Saga, SagaStatus


def job_for_worker(job: Any) -> dict[str, Any]:
    """What a worker (or the webhook receiver) needs to run one compensation; `token` goes back
    with the result."""
    return {
        "id": str(job.pk),
        "token": job.epoch,
        "saga_id": job.saga_id,
        "step_id": job.step_id,
        "step": job.ordinal,
        "tool": job.tool,
        "handler": job.handler,
        "kwargs": job.kwargs,
        "idempotency_key": job.idempotency_key,
        "attempt": job.attempts,
        "max_attempts": job.max_attempts,
        "lease_expires_at": job.lease_expires_at.isoformat() if job.lease_expires_at else None,
    }


def job_json(job: Job) -> dict[str, Any]:
    """A job as people and automation see it (no token: the holder has it)."""
    return {
        "id": str(job.pk),
        "run_id": job.run_id,
        "saga_id": job.saga_id,
        "step_id": job.step_id,
        "step": job.ordinal,
        "tool": job.tool,
        "semantics": job.semantics,
        "handler": job.handler,
        "delivery": job.delivery,
        "state": job.state,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "escalation": job.escalation,
        "last_error": job.last_error,
        "note": job.note,
        "resolved_by": job.resolved_by,
        "assignee": job.assignee,
        "assigned_at": job.assigned_at.isoformat() if job.assigned_at else None,
        "created_at": job.created_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }


def job(job_id: Any) -> Job | None:
    return Job.objects.filter(pk=job_id).first()


def jobs(*, state: str = "", saga_id: str = "") -> QuerySet[Job]:
    query = Job.objects.all()
    if state:
        query = query.filter(state=state)
    if saga_id:
        query = query.filter(saga_id=saga_id)
    return query.order_by("-created_at", "-ordinal")


def human_queue() -> QuerySet[Job]:
    """Steps waiting for a human: escalated, oldest first."""
    return Job.objects.filter(state=JobState.ESCALATED).order_by("escalated_at", "saga_id", "-ordinal")


def unfinished_run(saga_id: str) -> Run | None:
    return Run.objects.filter(saga_id=saga_id, state__in=[RunState.ACTIVE, RunState.ESCALATED]).first()


def jobs_by_step(saga_id: str) -> dict[str, Job]:
    """The latest job of each step of the saga (step id → job)."""
    out: dict[str, Job] = {}
    for row in Job.objects.filter(saga_id=saga_id).order_by("created_at"):
        out[row.step_id] = row
    return out


def compensations(saga_ids: list[str] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """(saga id, step id) → how recovery left that step: state ("compensated", "resolved" by a
    human with a note, "escalated", "pending", "claimed", "cancelled"), handler, idempotency key,
    attempts, finished_at. The latest job of each step counts. Steps recovery never touched are
    absent (an agent's own compensations are in the saga projection's step status)."""
    query = Job.objects.all().order_by("created_at")
    if saga_ids is not None:
        query = query.filter(saga_id__in=saga_ids)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in query:
        out[(row.saga_id, row.step_id)] = {
            "state": row.state,
            "handler": row.handler,
            "kwargs": row.kwargs,
            "idempotency_key": row.idempotency_key,
            "attempts": row.attempts,
            "note": row.note,
            "finished_at": row.finished_at,
        }
    return out


def webhook() -> Webhook | None:
    return Webhook.objects.first()


# ----------------------------------------------------------- what people are shown (one answer)
# The Sagas list (banner, rows), a saga's page and the Recovery page ask these, never their own
# variants, so they cannot disagree: a saga needs a human when its rollback ended partial or a
# step of its recovery waits for a decision (an escalated run); a saga whose lease expired is
# orphaned with recovery starting (not yet taken over) or started (its crash run), never running
# and never "needs a human" on that account alone.


def escalated_saga_ids(limit: int) -> set[str]:
    """Sagas with a recovery run waiting for a human (at most `limit`)."""
    return set(
        Run.objects.filter(state=RunState.ESCALATED).values_list("saga_id", flat=True).distinct()[:limit]
    )


def needs_human_count(cap: int) -> saga_selectors.BoundedCount:
    """How many sagas need a human (exact up to `cap`): partial rollbacks and escalated runs."""
    partial = saga_selectors.bounded_status_counts(
        saga_selectors.all_sagas(), timezone.now(), cap=cap, statuses=[SagaStatus.ROLLBACK_PARTIAL]
    )[SagaStatus.ROLLBACK_PARTIAL]
    escalated = escalated_saga_ids(cap + 1)
    both = Saga.objects.filter(saga_id__in=escalated, status=SagaStatus.ROLLBACK_PARTIAL).count()
    return (partial + saga_selectors.BoundedCount(len(escalated) - both)).capped(cap)


def needing_human(sagas: list[Saga]) -> set[str]:
    """Which of `sagas` need a human (their ids)."""
    ids = [saga.saga_id for saga in sagas]
    escalated = set(
        Run.objects.filter(saga_id__in=ids, state=RunState.ESCALATED).values_list("saga_id", flat=True)
    )
    return {saga.saga_id for saga in sagas if saga.status == SagaStatus.ROLLBACK_PARTIAL} | escalated


def partial_rollbacks() -> QuerySet[Saga]:
    """Sagas whose rollback ended partial with no recovery run waiting (those are in the human
    queue by their steps), most recent first (the Recovery page pages it)."""
    escalated = Run.objects.filter(state=RunState.ESCALATED).values("saga_id")
    return saga_selectors.newest_first(
        Saga.objects.filter(status=SagaStatus.ROLLBACK_PARTIAL).exclude(saga_id__in=escalated)
    )


def in_flight() -> QuerySet[Job]:
    """Compensations waiting for a worker or running, the latest first."""
    return Job.objects.filter(state__in=[JobState.CLAIMED, JobState.PENDING]).order_by("-created_at", "-pk")


def finished() -> QuerySet[Job]:
    """Compensations done by a worker or resolved by a person, the latest finished first."""
    return Job.objects.filter(state__in=[JobState.COMPENSATED, JobState.RESOLVED]).order_by(
        "-finished_at", "-pk"
    )


@dataclass(frozen=True)
class Orphaned:
    """A saga whose agent's lease expired: recovery `starting` (not taken over yet; `at` the
    lease's expiry) or `started` (taken over at `at`)."""

    phase: str
    at: datetime


def orphaned(saga: Saga, now: datetime) -> Orphaned | None:
    lease = Lease.objects.filter(saga_id=saga.saga_id).first()
    if saga.effective_status(now) == SagaStatus.ORPHANED:
        expired = lease.expires_at if lease is not None and lease.expires_at else saga.lease_expires_at
        return Orphaned("starting", expired or now)
    if lease is not None and lease.state == LeaseState.SWEPT and saga.status == SagaStatus.RECOVERING:
        run = Run.objects.filter(saga_id=saga.saga_id, kind=RunKind.CRASH).order_by("-created_at").first()
        if run is not None:
            return Orphaned("started", lease.swept_at or run.created_at)
    return None
