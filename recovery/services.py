"""Every state change of recovery: the lease watch (in the ingest transaction), the sweep, claims
and results of recovery jobs, the human queue's decisions, and "rollback to here".

The database row of a job is the truth: a claim is a conditional UPDATE (the candidate picked with
`FOR UPDATE SKIP LOCKED` on Postgres) that raises the job's `epoch`, its fencing token; a result
is recorded only by the holder of the current token while the job is claimed. Celery (webhook
deliveries) and HTTP long-polls (SDK workers) only wake the claimers.

Every result and decision is appended to the tenant's server stream in the same transaction,
carrying the saga id, so the saga projection shows it and the evidence keeps it:
RECOVERY_STARTED / RECOVERY_ESCALATED (a saga taken over), COMPENSATED / COMPENSATION_FAILED (a
job's result), RECOVERY_RETRY / RECOVERY_RESOLVED / RECOVERY_CANCELLED (a human's decision) and
ROLLBACK_END (a run finished).
"""

from __future__ import annotations

import logging
import math
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from sagaplane.semantics import idempotency_key as sdk_idempotency_key

from audit.hooks import AppendedRecords, OnStored
from audit.services import append_server_record, append_server_records
from controlplane.errors import DomainError
from controlplane.postcommit import after_commit
from fleet import selectors as fleet_selectors
from fleet import services as fleet_services
from recovery.models import (
    FINISHED_JOB_STATES,
    UNFINISHED_RUN_STATES,
    Delivery,
    Escalation,
    Job,
    JobState,
    Lease,
    LeaseState,
    Run,
    RunKind,
    RunState,
    Webhook,
)
from sagas import selectors as saga_selectors
from sagas.models import TERMINAL_STATUSES, StepStatus
from tenants.models import Tenant
from tenants.scoping import tenant_context
from transparency.keys import decrypt_seed, encrypt_seed

log = logging.getLogger(__name__)

SYSTEM_ACTOR = "system:recovery"
MAX_LEASE_TTL = 1e9  # as the saga projection: longer is not a lease
DEFAULT_JOB_LEASE_S = 30.0
MAX_JOB_LEASE_S = 300.0
MAX_ATTEMPTS = 5
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0
SWEEP_BATCH = 2000  # sagas taken over per tenant per sweep
TAKEOVER_BATCH = 100  # sagas per transaction
TEXT_MAX = 2000

LEASE_EVENTS = frozenset({"SAGA_START", "SAGA_LEASE"})
END_EVENTS = frozenset({"SAGA_COMPLETE", "SAGA_ABORTED"})
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


class RecoveryError(DomainError):
    """A refused recovery request, with a machine-readable code and the field at fault."""

    def __init__(self, status: int, code: str, detail: str, *, field: str = "") -> None:
        if field:
            super().__init__(status, code, detail, field=field)
        else:
            super().__init__(status, code, detail)


# ------------------------------------------------------------------------- the lease watch


def _ttl(value: Any) -> float | None:
    if type(value) in (int, float) and math.isfinite(value) and 0 < value <= MAX_LEASE_TTL:
        return float(value)
    return None


def watch_appended(appended: AppendedRecords) -> OnStored:
    """`audit.hooks` subscriber (inside the ingest transaction): keep each saga's lease by the
    server's receive time of its SAGA_START and SAGA_LEASE records, and close it on a terminal
    record. Nothing to do for a batch with none of these."""
    relevant = [
        (row, fields)
        for row, fields in appended.items
        if row.saga_id and row.event in LEASE_EVENTS | END_EVENTS
    ]

    def stored(base: int) -> None:
        if relevant:
            _update_leases(appended.tenant, relevant)

    return stored


def _update_leases(tenant: Tenant, items: Sequence[tuple[Any, dict[str, Any]]]) -> None:
    saga_ids = list(dict.fromkeys(row.saga_id for row, _ in items))
    leases = {lease.saga_id: lease for lease in Lease.objects.filter(saga_id__in=saga_ids)}
    new: dict[str, Lease] = {}
    for row, fields in items:
        lease = leases.get(row.saga_id) or new.get(row.saga_id)
        if lease is None:
            lease = new[row.saga_id] = Lease(tenant=tenant, saga_id=row.saga_id)
        if lease.state != LeaseState.LIVE:
            if lease.state == LeaseState.SWEPT and row.event in LEASE_EVENTS:
                log.warning("saga %s renewed its lease after recovery took it over", row.saga_id)
            continue
        if row.event in END_EVENTS:
            lease.state = LeaseState.ENDED
            continue
        if row.event == "SAGA_START":
            ttl = _ttl((fields or {}).get("lease_ttl"))
            lease.lease_ttl = ttl if ttl is not None else lease.lease_ttl
        when = row.received_at or timezone.now()
        if lease.renewed_at is None or when > lease.renewed_at:
            lease.renewed_at = when
        if lease.lease_ttl and lease.renewed_at is not None:
            try:
                lease.expires_at = lease.renewed_at + timedelta(seconds=lease.lease_ttl)
            except OverflowError:
                lease.expires_at = None
    if new:
        Lease.objects.bulk_create(new.values(), ignore_conflicts=True)
    if leases:
        Lease.objects.bulk_update(leases.values(), ["lease_ttl", "renewed_at", "expires_at", "state"])


# ------------------------------------------------------------------------------- taking over


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
class _RunRequest:
    saga: Any  # the projection's Saga
    steps: list[Any]
    kind: str
    to_ordinal: int
    lease_expired_at: datetime | None


def _start_runs(tenant: Tenant, requests: Sequence[_RunRequest], *, actor: str) -> list[Run]:
    """Queue, for each saga, one job per step after `to_ordinal` whose effect may stand (newest
    first), in set-based statements: the runs, their jobs, and one server-stream batch of
    RECOVERY_STARTED / RECOVERY_ESCALATED records. A saga with nothing to undo gets no run; one
    with any step that needs a human starts escalated. The caller makes sure no other run of these
    sagas is unfinished (the partial unique index refuses it otherwise)."""
    now = timezone.now()
    hooks: dict[str, bool] = {}
    planned: list[tuple[_RunRequest, list[_Plan], Run]] = []
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
            actor=actor,
            lease_expired_at=request.lease_expired_at,
            state=RunState.ESCALATED if escalated else RunState.ACTIVE,
            frontier=max(p.ordinal for p in plans),
            created_at=now,
        )
        planned.append((request, plans, run))
    if not planned:
        return []
    Run.objects.bulk_create([run for _, _, run in planned])
    jobs = []
    records: list[tuple[str, dict[str, Any]]] = []
    for request, plans, run in planned:
        for plan in plans:
            if plan.handler not in hooks:
                hooks[plan.handler] = _webhook_for(plan.handler) is not None
            jobs.append(
                Job(
                    tenant=tenant,
                    run=run,
                    saga_id=run.saga_id,
                    step_id=plan.step_id,
                    ordinal=plan.ordinal,
                    tool=plan.tool,
                    semantics=plan.semantics,
                    step_status=plan.status,
                    handler=plan.handler,
                    kwargs=plan.kwargs,
                    idempotency_key=plan.idempotency_key,
                    delivery=Delivery.WEBHOOK if hooks[plan.handler] else Delivery.WORKER,
                    state=JobState.ESCALATED if plan.escalation else JobState.PENDING,
                    escalation=plan.escalation,
                    escalated_at=now if plan.escalation else None,
                    max_attempts=MAX_ATTEMPTS,
                    available_at=now,
                    created_at=now,
                )
            )
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
        records.append(("RECOVERY_ESCALATED" if escalated_steps else "RECOVERY_STARTED", fields))
    Job.objects.bulk_create(jobs)
    append_server_records(tenant, records, actor=actor)
    runs = [run for _, _, run in planned]
    if any(hooks.values()):
        for run in runs:
            if run.state == RunState.ACTIVE:
                _wake_webhooks(tenant, run)
    return runs


def _quarantined_out(queryset: Any) -> Any:
    return queryset.exclude(saga_id__in=fleet_selectors.quarantined_saga_ids())


def sweep(tenant: Tenant, *, now: datetime | None = None, limit: int = SWEEP_BATCH) -> dict[str, int]:
    """One pass for one tenant: take over sagas whose lease expired with no terminal record
    (quarantined ones are skipped), escalate jobs whose workers kept dying, and wake webhook
    deliveries that are due. Sagas are taken over TAKEOVER_BATCH at a time, each batch in its own
    transaction, so workers start on the first batch while the next is queued."""
    now = now or timezone.now()
    taken = 0
    while taken < limit:
        with tenant_context(tenant):
            leases = list(
                _quarantined_out(Lease.objects.filter(state=LeaseState.LIVE, expires_at__lt=now))
                .order_by("expires_at")
                .select_for_update(skip_locked=True)[: min(TAKEOVER_BATCH, limit - taken)]
            )
            if not leases:
                break
            _take_over(tenant, leases, now)
        taken += len(leases)
    with tenant_context(tenant):
        exhausted = list(
            Job.objects.filter(
                state=JobState.CLAIMED, lease_expires_at__lt=now, attempts__gte=F("max_attempts")
            ).select_for_update(skip_locked=True)[:limit]
        )
        for job in exhausted:
            _escalate(
                tenant,
                job,
                Escalation.RETRIES_EXHAUSTED,
                f"its worker lost the lease on each of {job.attempts} attempts",
                actor=SYSTEM_ACTOR,
            )
        due_hooks = list(_claimable(now, Delivery.WEBHOOK).values_list("pk", flat=True)[:limit])
    for job_id in due_hooks:
        _enqueue_delivery(tenant.pk, job_id)
    return {"taken_over": taken, "escalated": len(exhausted), "webhooks_woken": len(due_hooks)}


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
            requests.append(_RunRequest(pair[0], pair[1], RunKind.CRASH, 0, lease.expires_at))
    _start_runs(tenant, requests, actor=SYSTEM_ACTOR)


# ------------------------------------------------------------------------------------ claims


def _claimable(now: datetime, delivery: str) -> Any:
    """Jobs a claimer may take now: ready (pending and due, or claimed with its lease run out and
    attempts left), of an active run, of a saga not quarantined, and at its run's frontier (the
    newest unfinished step: every later one is finished, so strictly newest first)."""
    ready = Q(state=JobState.PENDING, available_at__lte=now) | Q(
        state=JobState.CLAIMED, lease_expires_at__lt=now
    )
    return _quarantined_out(
        Job.objects.filter(
            ready,
            run__state=RunState.ACTIVE,
            ordinal=F("run__frontier"),
            delivery=delivery,
            attempts__lt=F("max_attempts"),
        )
    )


def _lease_seconds(value: Any) -> float:
    if value is None:
        return DEFAULT_JOB_LEASE_S
    if type(value) not in (int, float) or not math.isfinite(value) or not 1 <= value <= MAX_JOB_LEASE_S:
        raise RecoveryError(
            400, "invalid", f"lease_s: seconds from 1 to {MAX_JOB_LEASE_S:g}", field="lease_s"
        )
    return float(value)


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
    seconds = _lease_seconds(lease_s)
    with tenant_context(tenant):
        now = timezone.now()
        candidates = _claimable(now, delivery)
        if handlers is not None:
            candidates = candidates.filter(handler__in=list(handlers))
        if job_id is not None:
            candidates = candidates.filter(pk=job_id)
        candidate = (
            candidates.order_by("available_at", "created_at")
            .select_for_update(skip_locked=True, of=("self",))
            .first()
        )
        if candidate is None:
            return None
        updated = Job.objects.filter(pk=candidate.pk, epoch=candidate.epoch).update(
            state=JobState.CLAIMED,
            epoch=F("epoch") + 1,
            claimed_by=worker[:200],
            lease_expires_at=now + timedelta(seconds=seconds),
            attempts=F("attempts") + 1,
            first_claimed_at=Coalesce("first_claimed_at", Value(now)),
        )
        if not updated:
            return None  # taken meanwhile (SQLite has no row locks; the epoch guard decides)
        candidate.refresh_from_db()
        return candidate


def _held(job_id: Any, token: Any) -> Job:
    """The job, locked, if `token` is its current fencing token and it is still claimed."""
    if type(token) is not int:
        raise RecoveryError(400, "invalid", "token: the integer the claim returned", field="token")
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        raise RecoveryError(404, "not_found", "no such recovery job")
    if job.state != JobState.CLAIMED or job.epoch != token:
        raise RecoveryError(
            409,
            "stale_token",
            f"this job's current token is not {token} (it was claimed again, or already finished): "
            "nothing was recorded",
            field="token",
        )
    return job


def heartbeat(tenant: Tenant, job_id: Any, *, token: Any, lease_s: Any = None) -> Job:
    """Extend the holder's lease (a long compensation)."""
    seconds = _lease_seconds(lease_s)
    with tenant_context(tenant):
        job = _held(job_id, token)
        job.lease_expires_at = timezone.now() + timedelta(seconds=seconds)
        job.save(update_fields=["lease_expires_at"])
        return job


def _text(value: Any, name: str, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if (
        not isinstance(value, str)
        or (required and not value.strip())
        or len(value) > TEXT_MAX
        or "\x00" in value
    ):
        need = "a non-empty string" if required else "a string"
        raise RecoveryError(400, "invalid", f"{name}: {need} of at most {TEXT_MAX} characters", field=name)
    return value


def complete(tenant: Tenant, job_id: Any, *, token: Any, actor: str) -> Job:
    """Record a compensation as done, if `token` still holds the job (409 otherwise)."""
    with tenant_context(tenant):
        job = _held(job_id, token)
        run = Run.objects.select_for_update().get(pk=job.run_id)
        now = timezone.now()
        job.state = JobState.COMPENSATED
        job.finished_at = now
        job.lease_expires_at = None
        job.save(update_fields=["state", "finished_at", "lease_expires_at"])
        append_server_record(
            tenant,
            "COMPENSATED",
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
            actor=actor,
        )
        _maybe_finish(tenant, run)
        return job


def backoff(attempts: int) -> float:
    return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1)))


def fail(
    tenant: Tenant,
    job_id: Any,
    *,
    token: Any,
    actor: str,
    error: Any,
    retryable: Any = True,
    reason: Any = None,
) -> Job:
    """Record a failed attempt: retried after a backoff while attempts remain, else escalated.
    `reason="no_handler"` (the worker cannot run this handler) escalates at once."""
    message = _text(error, "error")
    if type(retryable) is not bool:
        raise RecoveryError(400, "invalid", "retryable: true or false", field="retryable")
    if reason not in (None, Escalation.NO_HANDLER.value):
        raise RecoveryError(400, "invalid", "reason: omit it, or 'no_handler'", field="reason")
    with tenant_context(tenant):
        job = _held(job_id, token)
        run = Run.objects.select_for_update().get(pk=job.run_id)
        final = reason is not None or not retryable or job.attempts >= job.max_attempts
        job.last_error = message
        job.lease_expires_at = None
        append_server_record(
            tenant,
            "COMPENSATION_FAILED",
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
            actor=actor,
        )
        if final:
            why = Escalation.NO_HANDLER if reason else Escalation.RETRIES_EXHAUSTED
            job.save(update_fields=["last_error", "lease_expires_at"])
            _escalate(tenant, job, why, message, actor=actor, run=run)
        else:
            job.state = JobState.PENDING
            job.available_at = timezone.now() + timedelta(seconds=backoff(job.attempts))
            job.save(update_fields=["state", "available_at", "last_error", "lease_expires_at"])
        return job


def _escalate(tenant: Tenant, job: Job, why: str, detail: str, *, actor: str, run: Run | None = None) -> None:
    run = run or Run.objects.select_for_update().get(pk=job.run_id)
    job.state = JobState.ESCALATED
    job.escalation = why
    job.escalated_at = timezone.now()
    job.lease_expires_at = None
    job.save(update_fields=["state", "escalation", "escalated_at", "lease_expires_at"])
    if run.state == RunState.ACTIVE:
        run.state = RunState.ESCALATED
        run.save(update_fields=["state"])
    append_server_record(
        tenant,
        "RECOVERY_ESCALATED",
        {
            "saga_id": job.saga_id,
            "run_id": run.pk,
            "step_id": job.step_id,
            "reason": str(why),
            "detail": detail[:TEXT_MAX],
            "old": {"job": "claimed"},
            "new": {"job": "escalated"},
        },
        actor=actor,
    )


def _maybe_finish(tenant: Tenant, run: Run) -> None:
    """Close the run (ROLLBACK_END) once every job is finished; reopen it (escalated → active)
    once no job waits for a human."""
    if run.state not in UNFINISHED_RUN_STATES:
        return
    rows = list(run.jobs.values_list("state", "ordinal"))
    jobs = [state for state, _ in rows]
    frontier = max((ordinal for state, ordinal in rows if state not in FINISHED_JOB_STATES), default=0)
    if frontier != run.frontier:
        run.frontier = frontier
        run.save(update_fields=["frontier"])
    if any(state not in FINISHED_JOB_STATES for state in jobs):
        if run.state == RunState.ESCALATED and JobState.ESCALATED not in jobs:
            run.state = RunState.ACTIVE
            run.save(update_fields=["state"])
            _wake_webhooks(tenant, run)
        return
    run.state = RunState.DONE
    run.finished_at = timezone.now()
    run.save(update_fields=["state", "finished_at"])
    end: dict[str, Any] = {
        "saga_id": run.saga_id,
        "run_id": run.pk,
        "clean": True,
        "compensated": jobs.count(JobState.COMPENSATED),
        "resolved": jobs.count(JobState.RESOLVED),
        "failed": 0,
        "orphaned": 0,
        "unresolved": 0,
        "halted": False,
        "recovery": run.kind,
    }
    if run.to_ordinal:
        end["to_step"] = run.to_ordinal
    append_server_record(tenant, "ROLLBACK_END", end, actor=SYSTEM_ACTOR)


# --------------------------------------------------------------------------- human decisions


def _job_for_decision(job_id: Any) -> tuple[Job, Run]:
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        raise RecoveryError(404, "not_found", "no such recovery job")
    run = Run.objects.select_for_update().get(pk=job.run_id)
    return job, run


def retry(tenant: Tenant, job_id: Any, *, actor: str) -> Job:
    """An escalated job goes back to the workers with a fresh set of attempts."""
    with tenant_context(tenant):
        job, run = _job_for_decision(job_id)
        if job.state != JobState.ESCALATED:
            raise RecoveryError(409, "not_escalated", f"this job is {job.state}, not waiting for a human")
        if not job.handler:
            raise RecoveryError(
                409, "no_handler", "this step has no named compensation to run: resolve it by hand instead"
            )
        old = {"state": job.state, "escalation": job.escalation, "attempts": job.attempts}
        job.state = JobState.PENDING
        job.attempts = 0
        job.available_at = timezone.now()
        job.escalation = ""
        job.save(update_fields=["state", "attempts", "available_at", "escalation"])
        append_server_record(
            tenant,
            "RECOVERY_RETRY",
            {
                "saga_id": job.saga_id,
                "step_id": job.step_id,
                "job_id": str(job.pk),
                "old": old,
                "new": {"state": job.state},
            },
            actor=actor,
        )
        _maybe_finish(tenant, run)
        return job


def resolve(tenant: Tenant, job_id: Any, *, actor: str, note: Any) -> Job:
    """A human says this step is dealt with (refunded by hand, confirmed harmless, ...), with a note."""
    with tenant_context(tenant):
        job, run = _job_for_decision(job_id)
        text = _text(note, "note", required=True)
        if job.state not in (JobState.ESCALATED, JobState.PENDING):
            raise RecoveryError(409, "not_open", f"this job is {job.state}: nothing to resolve")
        old = {"state": job.state, "escalation": job.escalation}
        job.state = JobState.RESOLVED
        job.note = text
        job.resolved_by = actor
        job.finished_at = timezone.now()
        job.save(update_fields=["state", "note", "resolved_by", "finished_at"])
        append_server_record(
            tenant,
            "RECOVERY_RESOLVED",
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
        _maybe_finish(tenant, run)
        return job


def quarantine(tenant: Tenant, saga_id: Any, *, actor: str, reason: Any) -> None:
    """Set the saga aside (fleet's quarantine: the gate refuses its steps) and cancel what recovery
    had queued for it. A job a worker holds now may still report its result."""
    fleet_services.quarantine(tenant, saga_id, actor=actor, reason=reason)
    with tenant_context(tenant):
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
                "RECOVERY_CANCELLED",
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


def rollback_to(tenant: Tenant, saga_id: Any, to_step: Any, *, actor: str) -> Run:
    """ "Rollback to here": compensate every step after ordinal `to_step` (0: all), newest first,
    by the same workers. Refused while the agent holds its lease or another run is unfinished."""
    if not isinstance(saga_id, str) or not 0 < len(saga_id) <= 128:
        raise RecoveryError(400, "invalid", "saga_id must be 1 to 128 characters", field="saga_id")
    with tenant_context(tenant):
        saga = saga_selectors.saga(saga_id)
        if saga is None:
            raise RecoveryError(404, "not_found", "no such saga")
        if type(to_step) is not int or to_step < 0:
            raise RecoveryError(400, "invalid", "to_step: a step number from 0", field="to_step")
        if fleet_selectors.is_quarantined(saga_id):
            raise RecoveryError(409, "quarantined", "this saga is quarantined: recovery leaves it alone")
        now = timezone.now()
        lease = Lease.objects.select_for_update().filter(saga_id=saga_id).first()
        if (
            lease is not None
            and lease.state == LeaseState.LIVE
            and lease.expires_at
            and lease.expires_at > now
        ):
            raise RecoveryError(
                409, "agent_running", "the agent still holds this saga's lease: it rolls back itself"
            )
        if Run.objects.filter(saga_id=saga_id, state__in=UNFINISHED_RUN_STATES).exists():
            raise RecoveryError(409, "run_unfinished", "this saga is already being rolled back")
        if lease is not None and lease.state == LeaseState.LIVE:
            lease.state = LeaseState.SWEPT  # the sweep must not start a second run for it
            lease.swept_at = now
            lease.save(update_fields=["state", "swept_at"])
        request = _RunRequest(saga, saga_selectors.steps_of(saga), RunKind.ROLLBACK_TO, to_step, None)
        try:
            with transaction.atomic():
                runs = _start_runs(tenant, [request], actor=actor)
        except IntegrityError:  # a run started meanwhile (the partial unique index)
            raise RecoveryError(409, "run_unfinished", "this saga is already being rolled back") from None
        if not runs:
            raise RecoveryError(
                409, "nothing_to_undo", "no step after this one has an effect to undo", field="to_step"
            )
        return runs[0]


# ------------------------------------------------------------------------------- webhooks


def set_webhook(tenant: Tenant, *, url: Any, handlers: Any = None, actor: str) -> tuple[Webhook, str]:
    """Deliver compensations (of `handlers`, or all) to `url`. Returns the webhook and its new
    signing secret, shown this once."""
    from django.core.exceptions import ValidationError
    from django.core.validators import URLValidator

    if not isinstance(url, str) or len(url) > 500:
        raise RecoveryError(400, "invalid", "url: an http(s) URL of at most 500 characters", field="url")
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise RecoveryError(
            400, "invalid", "url: an http(s) URL of at most 500 characters", field="url"
        ) from None
    handlers = [] if handlers is None else handlers
    if (
        not isinstance(handlers, list)
        or len(handlers) > 100
        or not all(isinstance(h, str) and 0 < len(h) <= 200 and "\x00" not in h for h in handlers)
    ):
        raise RecoveryError(400, "invalid", "handlers: a list of up to 100 handler names", field="handlers")
    secret = "whsec_" + secrets.token_urlsafe(32)
    with tenant_context(tenant):
        existing = Webhook.objects.select_for_update().first()
        old = None if existing is None else {"url": existing.url, "handlers": existing.handlers}
        if existing is not None:
            existing.delete()
        hook = Webhook.objects.create(
            url=url, handlers=handlers, encrypted_secret=encrypt_seed(secret.encode()), actor=actor
        )
        append_server_record(
            tenant,
            "RECOVERY_WEBHOOK_SET",
            {"old": old, "new": {"url": url, "handlers": handlers, "secret": "rotated"}},
            actor=actor,
        )
    return hook, secret


def delete_webhook(tenant: Tenant, *, actor: str) -> None:
    with tenant_context(tenant):
        existing = Webhook.objects.select_for_update().first()
        if existing is None:
            return
        old = {"url": existing.url, "handlers": existing.handlers}
        existing.delete()
        append_server_record(tenant, "RECOVERY_WEBHOOK_DELETED", {"old": old, "new": None}, actor=actor)


def webhook_secret(hook: Webhook) -> str:
    return decrypt_seed(hook.encrypted_secret).decode()


def _wake_webhooks(tenant: Tenant, run: Run) -> None:
    if not run.jobs.filter(delivery=Delivery.WEBHOOK).exists():
        return
    tenant_id = tenant.pk

    def wake() -> None:
        with tenant_context(tenant):
            due = list(
                _claimable(timezone.now(), Delivery.WEBHOOK).filter(run=run).values_list("pk", flat=True)
            )
        for job_id in due:
            _enqueue_delivery(tenant_id, job_id)

    after_commit(f"wake webhook deliveries of run {run.pk}", wake)


def _enqueue_delivery(tenant_id: int, job_id: uuid.UUID) -> None:
    from recovery.tasks import deliver_webhook

    deliver_webhook.delay(tenant_id, str(job_id))
