"""Every state change of recovery: the lease watch (in the ingest transaction), takeover (by the
sweep, and by workers' claims: `take_over_expired`), claims and results of recovery jobs, the
human queue's decisions, and "rollback to here".

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

import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from sagaplane.semantics import idempotency_key as sdk_idempotency_key

from audit.hooks import AppendedRecords, OnStored
from audit.services import (
    append_server_record,
    append_server_records,
    flush_server_records,
    queue_server_records,
)
from controlplane import timing
from controlplane.errors import DomainError
from controlplane.numbers import finite_number
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
from tenants.scoping import joined_tenant_context, tenant_context
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
TAKEOVER_BATCH = 250  # sagas per transaction
TEXT_MAX = 2000
EVIDENCE_STALE_S = 0.5  # pending that long: left behind, the sweep chains it

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
    if finite_number(value) and 0 < value <= MAX_LEASE_TTL:
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
    jobs: list[dict[str, Any]] = []
    records: list[tuple[str, dict[str, Any]]] = []
    for request, plans, run in planned:
        for plan in plans:
            if plan.handler not in hooks:
                hooks[plan.handler] = _webhook_for(plan.handler) is not None
            jobs.append(
                {
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
                    "delivery": Delivery.WEBHOOK if hooks[plan.handler] else Delivery.WORKER,
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
                }
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
    _insert_jobs(jobs)
    append_server_records(tenant, records, actor=actor)
    runs = [run for _, _, run in planned]
    if any(hooks.values()):
        for run in runs:
            if run.state == RunState.ACTIVE:
                _wake_webhooks(tenant, run)
    return runs


_JOB_COLUMNS: frozenset[str] = frozenset(str(field.column) for field in Job._meta.concrete_fields)


def _insert_jobs(rows: list[dict[str, Any]]) -> None:
    """Insert new jobs (every column given, by column name). On Postgres one INSERT from one JSON
    document (`json_populate_recordset` over the table's row type): a takeover of a thousand
    sagas spent seconds in bulk_create's per-field preparation. Elsewhere bulk_create."""
    if not rows:
        return
    if set(rows[0]) != _JOB_COLUMNS:  # the model gained or lost a column: keep this in step
        raise RuntimeError(f"job rows name {sorted(set(rows[0]) ^ _JOB_COLUMNS)} wrongly")
    if connection.vendor != "postgresql":
        Job.objects.bulk_create([Job(**row) for row in rows])
        return
    table = connection.ops.quote_name(Job._meta.db_table)
    document = json.dumps(rows, default=_json_value, separators=(",", ":"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, %s::json)",  # noqa: S608 (the model's table name)
            [document],
        )


def _json_value(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} in a job row")


def _quarantined_out(queryset: Any) -> Any:
    return queryset.exclude(saga_id__in=fleet_selectors.quarantined_saga_ids())


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
            _escalate(
                tenant,
                job,
                Escalation.RETRIES_EXHAUSTED,
                f"its worker lost the lease on each of {job.attempts} attempts",
                actor=SYSTEM_ACTOR,
            )
        unclaimed = _escalate_unclaimed(tenant, now, limit)
        due_hooks = list(_claimable(now, Delivery.WEBHOOK).values_list("pk", flat=True)[:limit])
    for job_id in due_hooks:
        _enqueue_delivery(tenant.pk, job_id)
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
    over (`_takeover_turn`), never waiting for them. `now` (tests) fixes the clock."""
    taken = 0
    while taken < limit:
        moment = now or timezone.now()
        with tenant_context(tenant):
            if exclusive and not _takeover_turn(tenant):
                break
            leases = list(
                _quarantined_out(Lease.objects.filter(state=LeaseState.LIVE, expires_at__lt=moment))
                .order_by("expires_at")
                .select_for_update(skip_locked=True)[: min(TAKEOVER_BATCH, limit - taken)]
            )
            if not leases:
                break
            _take_over(tenant, leases, moment)
        taken += len(leases)
    return taken


# pg_try_advisory_xact_lock's first key: "recovery takeover"; the second is the tenant.
_TAKEOVER_LOCK_CLASS = 0x5245_4356


def _takeover_turn(tenant: Tenant) -> bool:
    """Inside a transaction: whether this transaction may take the tenant's expired leases over
    now. Postgres: a transaction-scoped advisory lock per tenant, tried, never waited for (the
    other taker is doing it). SQLite: always (write transactions already run one at a time)."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_TAKEOVER_LOCK_CLASS, tenant.pk % 2**31])
        row = cursor.fetchone()
    return bool(row and row[0])


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
        _claimable(now, Delivery.WORKER)
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
        _escalate(tenant, job, Escalation.NO_HANDLER, detail, actor=SYSTEM_ACTOR)
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
            requests.append(_RunRequest(pair[0], pair[1], RunKind.CRASH, 0, lease.expires_at))
    _start_runs(tenant, requests, actor=SYSTEM_ACTOR)


# ------------------------------------------------------------------------------------ claims


def _claimable(now: datetime, delivery: str) -> Any:
    """Jobs a claimer may take now (written out for Postgres' claim in `_claim_in_one_statement`:
    change both): ready (pending and due, or claimed with its lease run out and
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
    _lease_seconds(lease_s)
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
    seconds = _lease_seconds(lease_s)
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
        candidates = _claimable(now, delivery)
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
    `_claimable` cost more than running it). The pick is `_claimable`'s readiness written out
    (the tests run both on both databases); the UPDATE's guard is the one the other databases
    use (each row's epoch as picked, a state a claim may leave)."""
    quote = connection.ops.quote_name
    not_quarantined, quarantine_params = fleet_selectors.not_quarantined_sql("j.saga_id")
    conditions = [
        "j.tenant_id = %s",
        "((j.state = %s AND j.available_at <= %s) OR (j.state = %s AND j.lease_expires_at < %s))",
        "r.state = %s",
        "j.ordinal = r.frontier",
        "j.delivery = %s",
        "j.attempts < j.max_attempts",
        not_quarantined,
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


def _held(job_id: Any, token: Any) -> Job:
    """The job, locked, if `token` is its current fencing token and it is still claimed."""
    _token(token)
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        raise RecoveryError(404, "not_found", "no such recovery job")
    if job.state != JobState.CLAIMED or job.epoch != token:
        raise _stale(token)
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


def _stale(token: Any) -> RecoveryError:
    return RecoveryError(
        409,
        "stale_token",
        f"this job's current token is not {token} (it was claimed again, or already finished): "
        "nothing was recorded",
        field="token",
    )


def _token(value: Any) -> int:
    if type(value) is not int:
        raise RecoveryError(400, "invalid", "token: the integer the claim returned", field="token")
    return value


def complete(tenant: Tenant, job_id: Any, *, token: Any, actor: str) -> Job:
    """Record a compensation as done, if `token` still holds the job (409 otherwise)."""
    (outcome,) = complete_many(tenant, [(job_id, token)], actor=actor)
    if isinstance(outcome, RecoveryError):
        raise outcome
    return outcome


def complete_many(
    tenant: Tenant, items: Sequence[tuple[Any, Any]], *, actor: str
) -> list[Job | RecoveryError]:
    """Record several compensations as done in one transaction: each (job id, token) whose token
    still holds its job is compensated, the others answer their error (404, 409 `stale_token`)
    and record nothing. One UPDATE for the jobs, one for their runs, and one server-stream batch
    of COMPENSATED records (then one of ROLLBACK_END for the runs this finished)."""
    for _, token in items:
        _token(token)
    with joined_tenant_context(tenant):  # refusals are answers, not exceptions: nothing to undo
        return _complete_locked(tenant, items, actor=actor)


def _complete_locked(
    tenant: Tenant, items: Sequence[tuple[Any, Any]], *, actor: str
) -> list[Job | RecoveryError]:
    ids = [job_id for job_id, _ in items]
    with timing.phase("lock_jobs"):
        jobs = {job.pk: job for job in Job.objects.select_for_update().filter(pk__in=ids).order_by("pk")}
    outcomes: list[Job | RecoveryError] = []
    good: dict[Any, Job] = {}
    for job_id, token in items:
        job = jobs.get(job_id)
        if job is None:
            outcomes.append(RecoveryError(404, "not_found", "no such recovery job"))
        elif job.state == JobState.COMPENSATED and job.epoch == token:
            # A completion sent again with the token that recorded it (its answer was lost, or a
            # claim that carried it is retried): the same answer, nothing recorded twice.
            outcomes.append(job)
        elif job.state != JobState.CLAIMED or job.epoch != token or job.pk in good:
            outcomes.append(_stale(token))
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
            )
        )
    with timing.phase("advance_runs"):
        records += _advance_runs(tenant, runs, now=now, defer=True)
    with timing.phase("evidence"):
        queue_server_records(tenant, records, actor=actor)
    return outcomes


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
        evidence: list[tuple[str, dict[str, Any]]] = [
            (
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
            )
        ]
        if final:
            why = Escalation.NO_HANDLER if reason else Escalation.RETRIES_EXHAUSTED
            job.save(update_fields=["last_error", "lease_expires_at"])
            _escalate(tenant, job, why, message, actor=actor, run=run, evidence=evidence)
        else:
            job.state = JobState.PENDING
            job.available_at = timezone.now() + timedelta(seconds=backoff(job.attempts))
            job.save(update_fields=["state", "available_at", "last_error", "lease_expires_at"])
        queue_server_records(tenant, evidence, actor=actor)
        return job


MAX_RESULTS = 500


def report_many(tenant: Tenant, results: Any, *, actor: str) -> list[Job | RecoveryError]:
    """Several results in one request and one transaction: `[{"id", "token", "ok": true} |
    {"id", "token", "ok": false, "error", "retryable"?, "reason"?}]`. Completions are recorded
    together (`complete_many`); each failure as `fail` records it. An item whose token no longer
    holds its job answers its error and records nothing; a malformed item refuses the whole
    request (400, naming it)."""
    if not isinstance(results, list) or not 0 < len(results) <= MAX_RESULTS:
        raise RecoveryError(400, "invalid", f"results: a list of 1 to {MAX_RESULTS} results", field="results")
    done: list[tuple[int, Any, int]] = []
    failed: list[tuple[int, Any, dict[str, Any]]] = []
    for i, item in enumerate(results):
        where = f"results[{i}]"
        if not isinstance(item, dict) or type(item.get("ok")) is not bool:
            raise RecoveryError(400, "invalid", f"{where}: an object with id, token and ok", field=where)
        try:
            job_id = uuid.UUID(item.get("id")) if isinstance(item.get("id"), str) else None
        except ValueError:
            job_id = None
        if job_id is None:
            raise RecoveryError(
                400, "invalid", f"{where}.id: a job id the claim returned", field=f"{where}.id"
            )
        if type(item.get("token")) is not int:
            raise RecoveryError(
                400, "invalid", f"{where}.token: the integer the claim returned", field=f"{where}.token"
            )
        if item["ok"]:
            done.append((i, job_id, item["token"]))
        else:
            _text(item.get("error"), f"{where}.error")
            if type(item.get("retryable", True)) is not bool:
                raise RecoveryError(
                    400, "invalid", f"{where}.retryable: true or false", field=f"{where}.retryable"
                )
            if item.get("reason") not in (None, Escalation.NO_HANDLER.value):
                raise RecoveryError(
                    400, "invalid", f"{where}.reason: omit it, or 'no_handler'", field=f"{where}.reason"
                )
            failed.append((i, job_id, item))
    outcomes: list[Job | RecoveryError | None] = [None] * len(results)
    # Joined: nothing written above; each failure keeps a savepoint of its own (`fail`).
    with joined_tenant_context(tenant):
        if done:
            completed = _complete_locked(tenant, [(job_id, token) for _, job_id, token in done], actor=actor)
            for (i, _, _), outcome in zip(done, completed, strict=True):
                outcomes[i] = outcome
        for i, job_id, item in failed:
            try:
                outcomes[i] = fail(
                    tenant,
                    job_id,
                    token=item["token"],
                    actor=actor,
                    error=item.get("error"),
                    retryable=item.get("retryable", True),
                    reason=item.get("reason"),
                )
            except RecoveryError as exc:
                outcomes[i] = exc
    return [outcome for outcome in outcomes if outcome is not None]


def _escalate(
    tenant: Tenant,
    job: Job,
    why: str,
    detail: str,
    *,
    actor: str,
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
        "RECOVERY_ESCALATED",
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


def _maybe_finish(tenant: Tenant, run: Run) -> None:
    _advance_runs(tenant, [run])


def _advance_runs(
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
            ended.append(("ROLLBACK_END", end))
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
        _wake_webhooks(tenant, run)
    return ended if defer else []


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
    from recovery.webhook import check_url, new_secret

    unsafe = check_url(url)
    if unsafe:
        raise RecoveryError(400, "unsafe_url", f"url: {unsafe}", field="url")
    handlers = [] if handlers is None else handlers
    if (
        not isinstance(handlers, list)
        or len(handlers) > 100
        or not all(isinstance(h, str) and 0 < len(h) <= 200 and "\x00" not in h for h in handlers)
    ):
        raise RecoveryError(400, "invalid", "handlers: a list of up to 100 handler names", field="handlers")
    secret = new_secret()
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
