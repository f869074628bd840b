"""Recovery runs: started for sagas taken over or rolled back to a step (one job per step whose
effect may stand), advanced as their jobs finish, and the human queue's escalation of a job."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone
from sagaplane.events import Event
from sagaplane.semantics import idempotency_key as sdk_idempotency_key

from core.actionaudit import append_server_records
from core.actors import Actor, stored
from recovery import queries
from recovery.actions.common import MAX_ATTEMPTS, SYSTEM_ACTOR, TEXT_MAX
from recovery.actions.webhooks import wake_webhooks
from recovery.models import (
    FINISHED_JOB_STATES,
    UNFINISHED_RUN_STATES,
    Delivery,
    Escalation,
    Job,
    JobState,
    Run,
    RunState,
    Webhook,
)
from sagas.models import StepStatus
from tenants.models import Tenant

# Steps whose effect may stand: committed, outcome unknown (intent, or the call raised), or a
# compensation the agent tried and failed.
_TARGET_STATUSES = frozenset(
    {
        StepStatus.INTENT,
        StepStatus.COMMITTED,
        StepStatus.UNKNOWN,
        StepStatus.COMPENSATION_FAILED,
        StepStatus.ORPHANED,
    }
)


@dataclass(frozen=True)
class _Plan:
    step_id: str
    ordinal: int
    tool: str
    semantics: str
    status: str
    handler: str
    kwargs: dict[str, Any]
    idempotency_key: str
    escalation: str


def _plan_step(saga_id: str, step: Any) -> _Plan | None:
    """What recovery does with one step whose effect may stand (None: nothing to undo)."""
    semantics = step.semantics or ""
    if semantics == "PREVIEW":
        return None
    comp = step.compensation if isinstance(step.compensation, dict) else {}
    handler = comp.get("handler") if isinstance(comp.get("handler"), str) else ""
    raw_kwargs = comp.get("kwargs")
    kwargs: dict[str, Any] = raw_kwargs if isinstance(raw_kwargs, dict) else {}
    recoverable = comp.get("recoverable") is True and bool(handler)
    key = comp.get("idempotency_key")
    if not isinstance(key, str) or not key or len(key) > 200:
        key = sdk_idempotency_key(saga_id, step.step_id, "compensate")
    unknown = step.status in (StepStatus.INTENT, StepStatus.UNKNOWN)
    escalation = ""
    if semantics == "IRREVERSIBLE":
        if unknown:
            escalation = Escalation.UNKNOWN_OUTCOME
        elif not recoverable:
            escalation = Escalation.IRREVERSIBLE
    elif step.status == StepStatus.INTENT and not recoverable:
        escalation = Escalation.UNKNOWN_OUTCOME  # died during the effect: no inverse was derived
    elif not recoverable:
        escalation = Escalation.NO_HANDLER
    return _Plan(
        step.step_id,
        step.ordinal,
        step.tool,
        semantics,
        step.status,
        handler or "",
        kwargs,
        key,
        escalation,
    )


def _webhook_for(handler: str) -> Webhook | None:
    hook = Webhook.objects.first()
    if hook is None or (hook.handlers and handler not in hook.handlers):
        return None
    return hook


@dataclass
class RunRequest:
    saga: Any  # the projection's Saga
    steps: list[Any]
    kind: str
    to_ordinal: int
    lease_expired_at: datetime | None


def start_runs(tenant: Tenant, requests: Sequence[RunRequest], *, actor: Actor) -> list[Run]:
    """Queue, for each saga, one job per step after `to_ordinal` whose effect may stand (newest
    first), in set-based statements: the runs, their jobs, and one server-stream batch of
    RECOVERY_STARTED / RECOVERY_ESCALATED records. A saga with nothing to undo gets no run; one
    with any step that needs a human starts escalated. The caller makes sure no other run of these
    sagas is unfinished (the partial unique index refuses it otherwise)."""
    now = timezone.now()
    hooks: dict[str, bool] = {}
    planned: list[tuple[RunRequest, list[_Plan], Run]] = []
    for request in requests:
        saga_id = request.saga.saga_id
        plans = [
            plan
            for step in sorted(request.steps, key=lambda s: -s.ordinal)
            if step.ordinal > request.to_ordinal
            and step.status in _TARGET_STATUSES
            and (plan := _plan_step(saga_id, step)) is not None
        ]
        if not plans:
            continue
        escalated = any(p.escalation for p in plans)
        run = Run(
            tenant=tenant,
            saga_id=saga_id,
            kind=request.kind,
            to_ordinal=request.to_ordinal,
            actor=stored(actor),
            lease_expired_at=request.lease_expired_at,
            state=RunState.ESCALATED if escalated else RunState.ACTIVE,
            frontier=max(p.ordinal for p in plans),
            created_at=now,
        )
        planned.append((request, plans, run))
    if not planned:
        return []
    Run.objects.bulk_create([run for _, _, run in planned])
    jobs: list[dict[str, Any]] = []
    records: list[tuple[str, dict[str, Any]]] = []
    for request, plans, run in planned:
        for plan in plans:
            if plan.handler not in hooks:
                hooks[plan.handler] = _webhook_for(plan.handler) is not None
            delivery = Delivery.WEBHOOK if hooks[plan.handler] else Delivery.WORKER
            jobs.append(_job_row(tenant, run, plan, delivery, now))
        records.append(_started_record(request, plans, run))
    queries.insert_jobs(jobs)
    append_server_records(tenant, records, actor=actor)
    runs = [run for _, _, run in planned]
    if any(hooks.values()):
        for run in runs:
            if run.state == RunState.ACTIVE:
                wake_webhooks(tenant, run)
    return runs


def _job_row(tenant: Tenant, run: Run, plan: _Plan, delivery: str, now: datetime) -> dict[str, Any]:
    """A new job's row, every column by name (`queries.insert_jobs`)."""
    return {
        "id": uuid.uuid4(),
        "tenant_id": tenant.pk,
        "run_id": run.pk,
        "saga_id": run.saga_id,
        "step_id": plan.step_id,
        "ordinal": plan.ordinal,
        "tool": plan.tool,
        "semantics": plan.semantics,
        "step_status": plan.status,
        "handler": plan.handler,
        "kwargs": plan.kwargs,
        "idempotency_key": plan.idempotency_key,
        "delivery": delivery,
        "state": JobState.ESCALATED if plan.escalation else JobState.PENDING,
        "epoch": 0,
        "claimed_by": "",
        "lease_expires_at": None,
        "attempts": 0,
        "max_attempts": MAX_ATTEMPTS,
        "available_at": now,
        "created_at": now,
        "first_claimed_at": None,
        "finished_at": None,
        "last_error": "",
        "escalation": plan.escalation,
        "escalated_at": now if plan.escalation else None,
        "note": "",
        "resolved_by": "",
        "assignee": "",
        "assigned_at": None,
    }


def _started_record(request: RunRequest, plans: list[_Plan], run: Run) -> tuple[str, dict[str, Any]]:
    """The run's RECOVERY_STARTED record (RECOVERY_ESCALATED when a step needs a human)."""
    fields: dict[str, Any] = {
        "saga_id": run.saga_id,
        "run_id": run.pk,
        "kind": run.kind,
        "steps": [p.step_id for p in plans],
        "old": {"status": request.saga.status},
    }
    if run.to_ordinal:
        fields["to_step"] = run.to_ordinal
    escalated_steps = {p.step_id: str(p.escalation) for p in plans if p.escalation}
    if escalated_steps:
        fields["escalated"] = escalated_steps
    return (Event.RECOVERY_ESCALATED if escalated_steps else Event.RECOVERY_STARTED, fields)


def escalate(
    tenant: Tenant,
    job: Job,
    why: str,
    detail: str,
    *,
    actor: Actor,
    run: Run | None = None,
    evidence: list[tuple[str, dict[str, Any]]] | None = None,
) -> None:
    """The job goes to the human queue. Its RECOVERY_ESCALATED record is appended, or added to
    `evidence` for the caller to record with its own."""
    run = run or Run.objects.select_for_update().get(pk=job.run_id)
    old_state = job.state
    job.state = JobState.ESCALATED
    job.escalation = why
    job.escalated_at = timezone.now()
    job.lease_expires_at = None
    job.save(update_fields=["state", "escalation", "escalated_at", "lease_expires_at"])
    if run.state == RunState.ACTIVE:
        run.state = RunState.ESCALATED
        run.save(update_fields=["state"])
    record = (
        Event.RECOVERY_ESCALATED,
        {
            "saga_id": job.saga_id,
            "run_id": run.pk,
            "step_id": job.step_id,
            "reason": str(why),
            "detail": detail[:TEXT_MAX],
            "old": {"job": str(old_state)},
            "new": {"job": "escalated"},
        },
    )
    if evidence is None:
        append_server_records(tenant, [record], actor=actor)
    else:
        evidence.append(record)


def maybe_finish(tenant: Tenant, run: Run) -> None:
    advance_runs(tenant, [run])


def advance_runs(
    tenant: Tenant, runs: Sequence[Run], *, now: datetime | None = None, defer: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """The runs are locked and some of their jobs changed: move each run's frontier to its newest
    unfinished job (which becomes available now, so the queue stays first come, first served),
    close the runs with every job finished (one batch of ROLLBACK_END records), and reopen
    (escalated → active) those with no job left waiting for a human. Set-based: one read of the
    runs' jobs and one UPDATE per kind of change. With `defer` the ROLLBACK_END records are
    returned for the caller to record with its own, else appended here."""
    now = now or timezone.now()
    open_runs = [run for run in runs if run.state in UNFINISHED_RUN_STATES]
    if not open_runs:
        return []
    rows: dict[int, list[tuple[Any, str, int, Any]]] = {run.pk: [] for run in open_runs}
    for run_id, pk, state, ordinal, claimed in Job.objects.filter(run_id__in=list(rows)).values_list(
        "run_id", "pk", "state", "ordinal", "first_claimed_at"
    ):
        rows[run_id].append((pk, state, ordinal, claimed))
    changed: list[Run] = []
    reopened: list[Run] = []
    arrived: list[Any] = []  # jobs that just reached their run's frontier, never claimed
    ended: list[tuple[str, dict[str, Any]]] = []
    for run in open_runs:
        jobs = rows[run.pk]
        unfinished = [job for job in jobs if job[1] not in FINISHED_JOB_STATES]
        frontier = max((ordinal for _, _, ordinal, _ in unfinished), default=0)
        dirty = False
        if frontier != run.frontier:
            run.frontier = frontier
            dirty = True
            arrived += [
                pk
                for pk, state, ordinal, claimed in unfinished
                if ordinal == frontier and state == JobState.PENDING and claimed is None
            ]
        if unfinished:
            waiting = any(state == JobState.ESCALATED for _, state, _, _ in unfinished)
            if run.state == RunState.ESCALATED and not waiting:
                run.state = RunState.ACTIVE
                dirty = True
                reopened.append(run)
        else:
            states = [state for _, state, _, _ in jobs]
            run.state = RunState.DONE
            run.finished_at = now
            dirty = True
            end: dict[str, Any] = {
                "saga_id": run.saga_id,
                "run_id": run.pk,
                "clean": True,
                "compensated": states.count(JobState.COMPENSATED),
                "resolved": states.count(JobState.RESOLVED),
                "failed": 0,
                "orphaned": 0,
                "unresolved": 0,
                "halted": False,
                "recovery": run.kind,
            }
            if run.to_ordinal:
                end["to_step"] = run.to_ordinal
            ended.append((Event.ROLLBACK_END, end))
        if dirty:
            changed.append(run)
    # Grouped UPDATEs (a few distinct values), not bulk_update's CASE per row: that cost more
    # Python than the rest of a batch of results together.
    groups: dict[tuple[int, str, datetime | None], list[int]] = {}
    for run in changed:
        groups.setdefault((run.frontier, run.state, run.finished_at), []).append(run.pk)
    for (frontier, state, finished_at), pks in groups.items():
        Run.objects.filter(pk__in=pks).update(frontier=frontier, state=state, finished_at=finished_at)
    if arrived:
        Job.objects.filter(pk__in=arrived, state=JobState.PENDING, available_at__lt=now).update(
            available_at=now
        )
    if ended and not defer:
        append_server_records(tenant, ended, actor=SYSTEM_ACTOR)
    for run in reopened:
        wake_webhooks(tenant, run)
    return ended if defer else []
