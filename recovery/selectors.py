"""Read-only questions about recovery, for the API, the pages and other apps (reconciliation
asks `compensations` which steps recovery compensated). Every query runs under the active tenant."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from recovery.models import Job, JobState, Run, RunState, Webhook


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


def runs_of(saga_id: str) -> list[Run]:
    return list(Run.objects.filter(saga_id=saga_id).order_by("-created_at"))


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
