"""People's decisions: retry or resolve an escalated job, quarantine a saga, "rollback to here"."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor, stored
from core.errors import DomainError
from core.scoping import require_tenant
from fleet import selectors as fleet_selectors
from fleet import services as fleet_services
from recovery.actions.runs import RunRequest, maybe_finish, start_runs
from recovery.inputs import Assignment, Resolution, RollbackTo
from recovery.models import (
    UNFINISHED_RUN_STATES,
    Job,
    JobState,
    Lease,
    LeaseState,
    Run,
    RunKind,
    RunState,
)
from sagas import selectors as saga_selectors
from tenants.models import Tenant


def _job_for_decision(job_id: Any) -> tuple[Job, Run]:
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        raise DomainError("not_found", "no such recovery job", status=404)
    run = Run.objects.select_for_update().get(pk=job.run_id)
    return job, run


def retry(tenant: Tenant, job_id: Any, *, actor: Actor) -> Job:
    """An escalated job goes back to the workers with a fresh set of attempts."""
    require_tenant(tenant)
    with transaction.atomic():
        job, run = _job_for_decision(job_id)
        if job.state != JobState.ESCALATED:
            raise DomainError(
                "not_escalated", f"this job is {job.state}, not waiting for a human", status=409
            )
        if not job.handler:
            raise DomainError(
                "no_handler",
                "this step has no named compensation to run: resolve it by hand instead",
                status=409,
            )
        old = {"state": job.state, "escalation": job.escalation, "attempts": job.attempts}
        job.state = JobState.PENDING
        job.attempts = 0
        job.available_at = timezone.now()
        job.escalation = ""
        job.save(update_fields=["state", "attempts", "available_at", "escalation"])
        append_server_record(
            tenant,
            Event.RECOVERY_RETRY,
            {
                "saga_id": job.saga_id,
                "step_id": job.step_id,
                "job_id": str(job.pk),
                "old": old,
                "new": {"state": job.state},
            },
            actor=actor,
        )
        maybe_finish(tenant, run)
        return job


def resolve(tenant: Tenant, job_id: Any, resolution: Resolution, *, actor: Actor) -> Job:
    """A human says this step is dealt with (refunded by hand, confirmed harmless, ...), with a note."""
    text = resolution.note
    require_tenant(tenant)
    with transaction.atomic():
        job, run = _job_for_decision(job_id)
        if job.state not in (JobState.ESCALATED, JobState.PENDING):
            raise DomainError("not_open", f"this job is {job.state}: nothing to resolve", status=409)
        old = {"state": job.state, "escalation": job.escalation}
        job.state = JobState.RESOLVED
        job.note = text
        job.resolved_by = stored(actor)
        job.finished_at = timezone.now()
        job.save(update_fields=["state", "note", "resolved_by", "finished_at"])
        append_server_record(
            tenant,
            Event.RECOVERY_RESOLVED,
            {
                "saga_id": job.saga_id,
                "step_id": job.step_id,
                "job_id": str(job.pk),
                "note": text,
                "old": old,
                "new": {"state": job.state},
            },
            actor=actor,
        )
        maybe_finish(tenant, run)
        return job


def assignees() -> list[str]:
    """The active tenant's members who may decide recovery (and so take up a job), by username."""
    from tenants.access import RECOVERY_DECIDE, decide
    from tenants.selectors import members

    return [m.user.get_username() for m in members() if decide(RECOVERY_DECIDE, membership=m) is None]


def assign(tenant: Tenant, job_id: Any, assignment: Assignment, *, actor: Actor) -> Job:
    """Someone takes up an escalated job: acknowledges it (the acting person names themself) or
    hands it to another member who may decide recovery; "" hands it back to nobody. Recorded
    (RECOVERY_ASSIGNED, old and new) in the same transaction."""
    require_tenant(tenant)
    with transaction.atomic():
        job, _ = _job_for_decision(job_id)
        name = assignment.assignee
        if job.state != JobState.ESCALATED:
            raise DomainError(
                "not_escalated", f"this job is {job.state}, not waiting for a human", status=409
            )
        if name and name not in assignees():
            raise DomainError(
                "not_assignable",
                "assignee: not a member of this tenant who may decide recovery",
                field="assignee",
            )
        old = {
            "assignee": job.assignee,
            "assigned_at": job.assigned_at.isoformat() if job.assigned_at else None,
        }
        job.assignee = name
        job.assigned_at = timezone.now() if name else None
        job.save(update_fields=["assignee", "assigned_at"])
        new = {
            "assignee": job.assignee,
            "assigned_at": job.assigned_at.isoformat() if job.assigned_at else None,
        }
        append_server_record(
            tenant,
            Event.RECOVERY_ASSIGNED,
            {"saga_id": job.saga_id, "step_id": job.step_id, "job_id": str(job.pk), "old": old, "new": new},
            actor=actor,
        )
        return job


def quarantine(tenant: Tenant, saga_id: Any, terms: fleet_services.QuarantineTerms, *, actor: Actor) -> None:
    """Set the saga aside (fleet's quarantine: the gate refuses its steps) and cancel what recovery
    had queued for it. A job a worker holds now may still report its result."""
    require_tenant(tenant)
    fleet_services.quarantine(tenant, saga_id, terms, actor=actor)
    with transaction.atomic():
        for run in Run.objects.select_for_update().filter(saga_id=saga_id, state__in=UNFINISHED_RUN_STATES):
            cancelled = list(
                run.jobs.filter(state__in=[JobState.PENDING, JobState.ESCALATED]).values_list(
                    "step_id", flat=True
                )
            )
            run.jobs.filter(state__in=[JobState.PENDING, JobState.ESCALATED]).update(
                state=JobState.CANCELLED, finished_at=timezone.now()
            )
            old_state = run.state
            run.state = RunState.CANCELLED
            run.finished_at = timezone.now()
            run.save(update_fields=["state", "finished_at"])
            append_server_record(
                tenant,
                Event.RECOVERY_CANCELLED,
                {
                    "saga_id": saga_id,
                    "run_id": run.pk,
                    "cancelled_steps": cancelled,
                    "reason": "quarantined",
                    "old": {"state": old_state},
                    "new": {"state": run.state},
                },
                actor=actor,
            )


def rollback_to(tenant: Tenant, saga_id: Any, rollback: RollbackTo, *, actor: Actor) -> Run:
    """ "Rollback to here": compensate every step after ordinal `to_step` (0: all), newest first,
    by the same workers. Refused while the agent holds its lease or another run is unfinished."""
    if not isinstance(saga_id, str) or not 0 < len(saga_id) <= 128:
        raise DomainError("invalid", "saga_id must be 1 to 128 characters", field="saga_id")
    require_tenant(tenant)
    with transaction.atomic():
        saga = saga_selectors.saga(saga_id)
        if saga is None:
            raise DomainError("not_found", "no such saga", status=404)
        if fleet_selectors.is_quarantined(saga_id):
            raise DomainError("quarantined", "this saga is quarantined: recovery leaves it alone", status=409)
        now = timezone.now()
        lease = Lease.objects.select_for_update().filter(saga_id=saga_id).first()
        if (
            lease is not None
            and lease.state == LeaseState.LIVE
            and lease.expires_at
            and lease.expires_at > now
        ):
            raise DomainError(
                "agent_running", "the agent still holds this saga's lease: it rolls back itself", status=409
            )
        if Run.objects.filter(saga_id=saga_id, state__in=UNFINISHED_RUN_STATES).exists():
            raise DomainError("run_unfinished", "this saga is already being rolled back", status=409)
        if lease is not None and lease.state == LeaseState.LIVE:
            lease.state = LeaseState.SWEPT  # the sweep must not start a second run for it
            lease.swept_at = now
            lease.save(update_fields=["state", "swept_at"])
        steps = saga_selectors.steps_of(saga)
        request = RunRequest(saga, steps, RunKind.ROLLBACK_TO, rollback.to_step, None)
        try:
            with transaction.atomic():
                runs = start_runs(tenant, [request], actor=actor)
        except IntegrityError:  # a run started meanwhile (the partial unique index)
            raise DomainError(
                "run_unfinished", "this saga is already being rolled back", status=409
            ) from None
        if not runs:
            raise DomainError(
                "nothing_to_undo", "no step after this one has an effect to undo", status=409, field="to_step"
            )
        return runs[0]
