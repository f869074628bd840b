"""Every state change of the fleet context, and the gate itself.

Policy changes (budgets, rate limits, halts, quarantines) take a keyword-only `actor` and append
their record (old and new values) to the tenant's server stream in the same transaction.

The gate (`evaluate`) answers in this order, and the first refusal wins: kill switch → quarantine
→ budgets and rate limits (one atomic check-and-debit across every matching limit, all or nothing)
→ approval (`fleet.hooks`: the approvals app plugs its step in from above). Anything that cannot be
read is a refusal.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import append_server_record
from controlplane import availability
from controlplane.errors import DomainError
from fleet import gate, hooks
from fleet.gate import Debit, GateRequest, InvalidArgument, LimitSpec
from fleet.models import BudgetLimit, Decision, GateDecision, Halt, HaltMode, OnCap, Quarantine, RateLimit
from fleet.stores import DatabaseStore, LedgerEntry, LimitStore, Outcome, RedisStore, StoreUnavailable
from sagas import selectors as saga_selectors
from tenants import epoch
from tenants.models import Tenant
from tenants.scoping import TENANT_SETTING, NeedsDatabase, scoped_without_database, tenant_context

log = logging.getLogger(__name__)

NAME_MAX = 100
MAX_WINDOW_S = 366 * 24 * 3600
MAX_TTL_S = 366 * 24 * 3600
# The cap of a budget an approved escalation lifts, for one call: above any window's possible sum
# (both stores keep sums exact below 2**53).
UNCAPPED = 2**52


class FleetError(DomainError):
    """A refused policy change, with a machine-readable code and the field at fault."""

    def __init__(self, code: str, field: str, detail: str, status: int = 400) -> None:
        super().__init__(status, code, detail, field=field)
        self.field = field


# ------------------------------------------------------------------------------------- change signal


def version_key(tenant_id: int) -> str:
    """The tenant's change counter (`tenants.epoch`): fleet status long-polls wait on it, every
    process' gate compares its policy snapshot against it."""
    return epoch.key(tenant_id)


def _changed_after_commit(tenant: Tenant) -> None:
    """Wake every long-poll of the tenant's fleet status once the change commits (best effort:
    waiters re-read the state every second anyway), and make every process' gate re-read the
    tenant's policies on its next decision (this one at once)."""
    forget_policies(tenant)
    epoch.bump_after_commit(tenant.pk, "fleet status change signal")


def policies_changed(tenant: Tenant) -> None:
    """Another app's policy that the gate or the fleet status reads changed (approval policies
    add governed tools): the same signal as a change here, once the change commits."""
    _changed_after_commit(tenant)


# ----------------------------------------------------------------------------------------- the store

_store: LimitStore | None = None


def get_store() -> LimitStore:
    """Redis when configured (SAGAPLANE_GATE_STORE=redis, the default with REDIS_URL), else the
    database. One per process; `set_store` swaps it (tests, benchmarks)."""
    global _store
    if _store is None:
        _store = _configured_store()
    return _store


def set_store(store: LimitStore | None) -> None:
    global _store
    _store = store


def _configured_store() -> LimitStore:
    if settings.SAGAPLANE_GATE_STORE == "redis":
        import redis

        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0, health_check_interval=30
        )
        return RedisStore(client, ledger_since)
    return DatabaseStore()


def gate_tag(tenant: Tenant) -> str:
    """The hash tag of every Redis key of the tenant's gate: its id and creation time, so a
    database re-created beside a Redis that outlived it (ids counting from 1 again, as every test
    run does) never inherits another tenant's counters."""
    return f"t{tenant.pk}.{int(tenant.created_at.timestamp() * 1_000_000)}"


def ledger_since(tenant_id: int, since_ms: int) -> list[LedgerEntry]:
    """The tenant's allowed decisions since `since_ms` (what a Redis rebuild replays)."""
    tenant = Tenant.objects.get(pk=tenant_id)
    since = datetime.fromtimestamp(since_ms / 1000, tz=timezone.get_current_timezone())
    with tenant_context(tenant):
        rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
            "id", "idempotency_key", "decided_at", "debits"
        )
        return [
            LedgerEntry(str(pk), key, int(decided_at.timestamp() * 1000), debits)
            for pk, key, decided_at, debits in rows.iterator()
        ]


# ------------------------------------------------------------------------------------------ the gate


def _limit_specs() -> list[LimitSpec]:
    budgets = [
        LimitSpec(
            id=b.pk,
            kind="budget",
            name=b.name,
            tool=b.tool,
            per=tuple(b.per),
            window_s=b.window_s,
            cap_units=gate.to_units(b.max_total),
            argument=b.argument,
            on_cap=b.on_cap,
        )
        for b in BudgetLimit.objects.order_by("pk")
    ]
    rates = [
        LimitSpec(
            id=r.pk,
            kind="rate",
            name=r.name,
            tool=r.tool,
            per=tuple(r.per),
            window_s=r.window_s,
            cap_units=r.max_calls,
        )
        for r in RateLimit.objects.order_by("pk")
    ]
    return budgets + rates


def halts_in_force(now: datetime | None = None) -> list[Halt]:
    now = now or timezone.now()
    return list(
        Halt.objects.filter(lifted_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .order_by("created_at", "pk")
    )


def is_quarantined(saga_id: str) -> bool:
    return Quarantine.objects.filter(saga_id=saga_id, released_at__isnull=True).exists()


def _saga_known_before(saga_id: str, moment: datetime) -> bool:
    """Was this saga already running when a drain began? (it asked the gate before then)"""
    return GateDecision.objects.filter(
        saga_id=saga_id, decision=Decision.ALLOW, decided_at__lt=moment
    ).exists()


def _deny(request: GateRequest, reason: str, *, actor_prefix: str, **detail: Any) -> dict[str, Any]:
    row = GateDecision.objects.create(
        idempotency_key=request.idempotency_key,
        saga_id=request.saga_id,
        step_id=request.step_id,
        tool=request.tool,
        agent=request.agent,
        api_key_prefix=actor_prefix,
        args_digest=request.args_digest,
        decision=Decision.DENY,
        reason=reason,
        detail=detail,
    )
    return row.answer()


# ----------------------------------------------------------------------------- policy snapshot

SNAPSHOTS_KEPT = 1000


@dataclass(frozen=True)
class _Policies:
    """What the gate needs of a tenant's policies, read once and reused while the tenant's epoch
    (`tenants.epoch`) reads as it did before they were read: its limits, its halts not lifted (each
    checked against its expiry at use) and its quarantined sagas."""

    specs: list[LimitSpec]
    halts: list[Halt]
    quarantined: frozenset[str]
    version: Any
    read_at: float


# Keyed by the tenant's gate tag (id and creation time), not its id: ids repeat where a database
# is re-created (SQLite tests reuse them after each rollback), a tenant's creation time does not.
_snapshots: OrderedDict[str, _Policies] = OrderedDict()
_snapshots_lock = threading.Lock()
_UNREAD: Any = object()
# The epoch the decision running in this context read: the approval step's own snapshot reuses it
# (one cache read per decision, not one per snapshot).
_decision_epoch: contextvars.ContextVar[tuple[int, Any] | None] = contextvars.ContextVar(
    "fleet_decision_epoch", default=None
)


def _current_version(tenant_id: int) -> Any:
    """The tenant's change counter (None when the cache cannot be read: then nothing is reused);
    inside a decision, the value that decision read."""
    held = _decision_epoch.get()
    if held is not None and held[0] == tenant_id:
        return held[1]
    return epoch.read(tenant_id)


def forget_policies(tenant: Tenant) -> None:
    """Drop this process' snapshot of the tenant's policies (a change here, or a test)."""
    with _snapshots_lock:
        _snapshots.pop(gate_tag(tenant), None)


def _held_policies(tenant: Tenant, version: Any) -> _Policies | None:
    """This process' snapshot, when the epoch has not moved since it was read (read before it, so
    a change committing meanwhile leaves the snapshot behind the epoch: re-read next time) and it
    is younger than `epoch.MAX_AGE_S` (the bound for a lost bump or a per-process cache)."""
    if version is None:
        return None
    with _snapshots_lock:
        held = _snapshots.get(gate_tag(tenant))
    if held is not None and held.version == version and time.monotonic() - held.read_at < epoch.MAX_AGE_S:
        return held
    return None


def _read_policies(tenant: Tenant, version: Any) -> _Policies:
    """Read the tenant's policies (inside its tenant context) and keep them under `version`."""
    fresh = _Policies(
        specs=_limit_specs(),
        halts=list(Halt.objects.filter(lifted_at__isnull=True).order_by("created_at", "pk")),
        quarantined=frozenset(
            Quarantine.objects.filter(released_at__isnull=True).values_list("saga_id", flat=True)
        ),
        version=version,
        read_at=time.monotonic(),
    )
    if version is not None:
        with _snapshots_lock:
            _snapshots[gate_tag(tenant)] = fresh
            _snapshots.move_to_end(gate_tag(tenant))
            while len(_snapshots) > SNAPSHOTS_KEPT:
                _snapshots.popitem(last=False)
    return fresh


def _policies(tenant: Tenant) -> _Policies:
    """The tenant's policies, from this process' snapshot while it is current (inside its tenant
    context: read again otherwise)."""
    version = _current_version(tenant.pk)
    return _held_policies(tenant, version) or _read_policies(tenant, version)


# ------------------------------------------------------------------------------------------ the gate


class _NeedsTransaction(Exception):
    """The lean path met something it does not do (an approval step that must read or write):
    the whole decision is taken again inside the tenant's transaction."""


def evaluate(
    tenant: Tenant,
    request: GateRequest,
    *,
    actor: str,
    store: LimitStore | None = None,
    version: Any = _UNREAD,
) -> dict[str, Any]:
    """The gate's answer for one call (see the module docstring for the order).

    `version`: the tenant's epoch when the caller already read it for this call (the lean HTTP
    path reads it once for its key check and the decision).

    On Redis with Postgres, outside any transaction, the decision takes the lean path: policies
    from this process' snapshot (re-read when the epoch moved), one EVALSHA, and the ledger row in
    one statement batch that sets the tenant for row-level security and commits — with the epoch's
    GET, three round trips in all. Anything else (an approval to consult, an escalation, a drain to
    check against the ledger) opens the tenant's transaction for that part, or for the whole
    decision."""
    availability.guard()  # a store known to be down: refused before anything is read
    store = store or get_store()
    if version is _UNREAD:
        version = epoch.read(tenant.pk)
    token = _decision_epoch.set((tenant.pk, version))
    try:
        lean = isinstance(store, RedisStore) and connection.vendor == "postgresql"
        if lean and not connection.in_atomic_block:
            try:
                return _decide(tenant, request, actor=actor, store=store, version=version, lean=True)
            except _NeedsTransaction:
                pass
        with tenant_context(tenant):
            return _decide(tenant, request, actor=actor, store=store, version=version, lean=False)
    finally:
        _decision_epoch.reset(token)


def _decide(
    tenant: Tenant, request: GateRequest, *, actor: str, store: LimitStore, version: Any, lean: bool
) -> dict[str, Any]:
    """The decision. `lean`: outside any transaction (see `evaluate`): reads that the snapshot
    cannot answer open the tenant's transaction, refusals and the ledger row are written by
    `_write_lean`; `_NeedsTransaction` may be raised only before anything is debited or written."""
    key_prefix = request.api_key_prefix

    def database() -> Any:
        return tenant_context(tenant) if lean else nullcontext()

    def deny(reason: str, **detail: Any) -> dict[str, Any]:
        if lean:
            return _write_lean(tenant, request, Decision.DENY, reason=reason, detail=detail)
        return _deny(request, reason, actor_prefix=key_prefix, **detail)

    if not isinstance(store, RedisStore):
        # Redis answers a retry from its own idempotency key; the database store asks here.
        earlier = GateDecision.objects.filter(
            idempotency_key=request.idempotency_key, decision=Decision.ALLOW
        ).first()
        if earlier is not None:
            return earlier.answer()
    policies = _held_policies(tenant, version)
    if policies is None:
        with database():
            policies = _read_policies(tenant, version)
    now = timezone.now()
    for halt in policies.halts:
        if halt.expires_at is not None and halt.expires_at <= now:
            continue
        if not gate.halt_matches(halt.scope, request):
            continue
        if halt.mode == HaltMode.HALT:
            return deny("halted", scope=halt.scope, halt_reason=halt.reason, retry_after=None)
        with database():
            known = _saga_known_before(request.saga_id, halt.created_at)
        if not known:
            return deny("draining", scope=halt.scope, halt_reason=halt.reason, retry_after=None)
    if request.saga_id in policies.quarantined:
        return deny("quarantined", retry_after=None)
    step = hooks.approval_step()
    escalating = any(
        s.kind == "budget" and s.on_cap == OnCap.ESCALATE and gate.tool_matches(s.tool, request.tool)
        for s in policies.specs
    )
    verdict = hooks.NONE
    if step is not None and lean:
        # Usually answered from the approvals' own snapshot; what must read or write (a policy
        # that applies, an earlier escalation) runs in the tenant's transaction with the decision.
        try:
            with scoped_without_database(tenant):
                verdict = step.before_debit(tenant, request, escalating=escalating)
        except NeedsDatabase:
            raise _NeedsTransaction from None
        if verdict.kind != "none":
            raise _NeedsTransaction
    elif step is not None:
        verdict = step.before_debit(tenant, request, escalating=escalating)
    if verdict.kind == "pending":
        return verdict.answer
    if verdict.kind == "refused":
        return _deny(request, actor_prefix=key_prefix, **verdict.answer)
    if verdict.kind == "consumed":
        return _earlier_allow(request) or _deny(
            request, "approval_consumed", actor_prefix=key_prefix, retry_after=None
        )
    try:
        debits = gate.debits_for(policies.specs, request, tenant_tag=gate_tag(tenant))
    except InvalidArgument as exc:
        return deny(
            "invalid_argument",
            limit=exc.limit,
            argument=exc.argument,
            message=exc.detail,
            retry_after=None,
        )
    if verdict.uncapped:
        # An approved escalation: these budgets' caps do not hold for this one call (it is still
        # debited, so its spend counts against everything after it).
        debits = [
            replace(d, cap=UNCAPPED) if d.kind == "budget" and d.limit in verdict.uncapped else d
            for d in debits
        ]
    decision_id = uuid.uuid4()
    try:
        outcome = store.check_and_debit(
            tenant.pk,
            debits,
            idempotency_key=request.idempotency_key,
            decision_id=str(decision_id),
            tag=gate_tag(tenant),
        )
    except StoreUnavailable as exc:
        outage = availability.failed(exc, probe=_redis_probe(store))
        if outage is not None:  # Redis unreachable: every call refused, fast, until it answers
            raise outage from exc
        log.warning("gate: limit store unavailable for tenant %s: %s", tenant.pk, exc)
        return deny("limit_store_unavailable", retry_after=1)
    # From here on, something may be debited: nothing below raises _NeedsTransaction.
    if not outcome.allowed:
        failed = outcome.failed
        if (
            step is not None
            and failed is not None
            and failed.kind == "budget"
            and any(
                s.kind == "budget" and s.name == failed.limit and s.on_cap == OnCap.ESCALATE
                for s in policies.specs
            )
        ):
            with database():
                escalated = step.escalate(tenant, request, failed.limit, debits)
                if escalated.kind == "pending":
                    return escalated.answer
                if escalated.kind == "refused":
                    return _deny(request, actor_prefix=key_prefix, **escalated.answer)
                return _refusal(request, outcome, actor_prefix=key_prefix)
        return _refusal(request, outcome, deny=deny, actor_prefix=key_prefix)
    if outcome.duplicate_of is not None:
        decision_id = uuid.UUID(outcome.duplicate_of)
        with database():
            existing = GateDecision.objects.filter(pk=decision_id).first()
        if existing is not None:
            return existing.answer()
        # The store debited under this id but its ledger row never committed: record it now
        # (the debit is already counted, so this allows nothing the counters did not).
    late = (time.monotonic() - outcome.debited_at) * 1000 > getattr(store, "commit_deadline_ms", math.inf)
    if outcome.debited_at and late:
        # Too late to be sure a rebuild fenced us in: refuse (the Redis debit stays, erring
        # toward refusal).
        return deny("limit_store_unavailable", retry_after=1)
    if lean:  # (no approval to consume: the lean path has none)
        return _write_lean(tenant, request, Decision.ALLOW, decision_id=decision_id, debits=debits)
    try:
        with transaction.atomic():
            row = _record_allow(decision_id, request, key_prefix, debits, verdict.requests)
            if (
                verdict.requests
                and step is not None
                and not step.consume(tenant, verdict.requests, authorization_id=str(decision_id), actor=actor)
            ):
                raise _NotConsumable
    except _NotConsumable:
        # Used or lapsed since it was read (a racing call took it): this call starts nothing.
        return _earlier_allow(request) or _deny(
            request, "approval_consumed", actor_prefix=key_prefix, retry_after=None
        )
    except IntegrityError:
        # The same call allowed meanwhile (a retry racing itself, or one whose Redis key had
        # expired): the first allow stands; this debit stays counted, erring toward refusal.
        first = GateDecision.objects.get(idempotency_key=request.idempotency_key, decision=Decision.ALLOW)
        return first.answer()
    return row.answer()


def _redis_probe(store: LimitStore) -> Callable[[], None] | None:
    """What tells that the gate's Redis is back (controlplane.availability probes it while the
    gate refuses): it answers and the counters of every tenant this process served recently are
    ready, so the first calls after it do not wait out a rebuild's fence (`RedisStore.make_ready`)."""
    if not isinstance(store, RedisStore):
        return None

    def probe() -> None:
        with _snapshots_lock:
            tags = list(_snapshots)
        store.make_ready([(int(tag[1:].partition(".")[0]), tag) for tag in tags])  # gate_tag's form

    return probe


_LEDGER = GateDecision._meta.db_table
_LEDGER_COLUMNS = (
    "id",
    "tenant_id",
    "idempotency_key",
    "saga_id",
    "step_id",
    "tool",
    "agent",
    "api_key_prefix",
    "args_digest",
    "decision",
    "reason",
    "detail",
    "debits",
    "decided_at",
)
# One batch, one round trip: the tenant for row-level security (SET LOCAL) and the row, in one
# implicit transaction that has committed -- the row is durable -- when the batch answers. An allow
# whose idempotency key already has one inserts nothing and returns no id (the first stands).
# A refusal's row is a dashboard entry, not a ledger entry (it debited nothing; the agent's WAL
# keeps its own GATE_DENY): its commit does not wait for the WAL flush (synchronous_commit off
# for that transaction alone), so refusals cost no fsync; an allow's commits as the server is
# configured (waiting for the flush, and for synchronous standbys where there are).
_LEDGER_BATCH = (
    f"SELECT set_config('{TENANT_SETTING}', %s, true), "
    "set_config('synchronous_commit', coalesce(%s, current_setting('synchronous_commit')), true); "
    f"INSERT INTO {_LEDGER} ({', '.join(_LEDGER_COLUMNS)}) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s) "
    "ON CONFLICT (tenant_id, idempotency_key) WHERE decision = 'allow' DO NOTHING RETURNING id"
)


def _write_lean(
    tenant: Tenant,
    request: GateRequest,
    decision: Decision,
    *,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    decision_id: uuid.UUID | None = None,
    debits: Sequence[Debit] = (),
) -> dict[str, Any]:
    """Write one decision in one round trip (`_LEDGER_BATCH`) outside any transaction, and answer
    it. An allow is answered only once its row has committed; a ledger that cannot be written
    refuses (`limit_store_unavailable`: any debit already made stays, erring toward refusal)."""
    detail = detail or {}
    row_id = decision_id or uuid.uuid4()
    params: list[Any] = [
        str(tenant.pk),
        "off" if decision == Decision.DENY else None,  # an allow: as the server is configured
        row_id,
        tenant.pk,
        request.idempotency_key,
        request.saga_id,
        request.step_id,
        request.tool,
        request.agent,
        request.api_key_prefix,
        request.args_digest,
        decision.value,
        reason,
        json.dumps(detail, cls=DjangoJSONEncoder),
        json.dumps([d.as_ledger() for d in debits]),
        timezone.now(),
    ]
    try:
        with connection.cursor() as cursor:
            cursor.execute(_LEDGER_BATCH, params)
            cursor.nextset()
            inserted = cursor.fetchone() is not None
    except DatabaseError as exc:
        outage = availability.failed(exc)
        if outage is not None:  # any debit already made stays: erring toward refusal
            raise outage from exc
        log.warning("gate: ledger unavailable for tenant %s: %s", tenant.pk, exc)
        if decision == Decision.DENY:
            return {"decision": "deny", "reason": reason, **detail}
        return {"decision": "deny", "reason": "limit_store_unavailable", "retry_after": 1}
    if decision == Decision.DENY:
        return {"decision": "deny", "reason": reason, **detail}
    if not inserted:
        # The same call allowed meanwhile (a retry racing itself): the first allow stands; this
        # debit stays counted, erring toward refusal.
        with tenant_context(tenant):
            first = GateDecision.objects.get(idempotency_key=request.idempotency_key, decision=Decision.ALLOW)
        return first.answer()
    return {"decision": "allow", "authorization_id": str(row_id)}


class _NotConsumable(Exception):
    """An approval read as usable was used or lapsed before this authorisation could take it."""


def _earlier_allow(request: GateRequest) -> dict[str, Any] | None:
    earlier = GateDecision.objects.filter(
        idempotency_key=request.idempotency_key, decision=Decision.ALLOW
    ).first()
    return None if earlier is None else earlier.answer()


def _record_allow(
    decision_id: uuid.UUID,
    request: GateRequest,
    key_prefix: str,
    debits: list[Debit],
    approvals: Sequence[str] = (),
) -> GateDecision:
    return GateDecision.objects.create(
        id=decision_id,
        idempotency_key=request.idempotency_key,
        saga_id=request.saga_id,
        step_id=request.step_id,
        tool=request.tool,
        agent=request.agent,
        api_key_prefix=key_prefix,
        args_digest=request.args_digest,
        decision=Decision.ALLOW,
        debits=[d.as_ledger() for d in debits],
        detail={"approvals": list(approvals)} if approvals else {},
    )


def _refusal(
    request: GateRequest,
    outcome: Outcome,
    *,
    actor_prefix: str,
    deny: Callable[..., dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The store's refusal as the gate's answer, written by `deny` (default: an ORM row in the
    caller's transaction)."""
    failed = outcome.failed
    assert failed is not None
    if deny is None:

        def deny(reason: str, **detail: Any) -> dict[str, Any]:
            return _deny(request, reason, actor_prefix=actor_prefix, **detail)

    retry = None if outcome.retry_after_ms is None else max(1, math.ceil(outcome.retry_after_ms / 1000))
    if failed.kind == "rate":
        return deny(
            "rate_limited",
            limit=failed.limit,
            scope=failed.scope,
            remaining=0,
            retry_after=retry,
        )
    return deny(
        "budget_exceeded",
        limit=failed.limit,
        scope=failed.scope,
        remaining=gate.from_units(max(0, failed.cap - outcome.used)),
        requested=gate.from_units(failed.amount),
        retry_after=retry,
    )


def governed_tools() -> list[str]:
    """The tool globs some limit applies to (halts and quarantines apply to every call)."""
    globs = set(BudgetLimit.objects.values_list("tool", flat=True))
    globs |= set(RateLimit.objects.values_list("tool", flat=True))
    step = hooks.approval_step()
    if step is not None:
        globs |= set(step.governed_tools())
    return sorted(globs)


def budget_usage(limit: BudgetLimit, now: datetime | None = None) -> list[dict[str, Any]]:
    """Spend per scope of one budget over its window, read from the ledger (the durable truth)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=limit.window_s)
    totals: dict[str, int] = {}
    rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
        "debits", flat=True
    )
    for debits in rows.iterator():
        for debit in debits:
            if debit.get("kind") == "budget" and debit.get("limit") == limit.name:
                totals[debit["scope"]] = totals.get(debit["scope"], 0) + int(debit["amount"])
    cap = gate.to_units(limit.max_total)
    return [
        {
            "scope": scope,
            "used": gate.from_units(used),
            "cap": gate.from_units(cap),
            "ratio": used / cap if cap else 1,
        }
        for scope, used in sorted(totals.items())
    ]


def rate_usage(limit: RateLimit, now: datetime | None = None) -> list[dict[str, Any]]:
    """Calls allowed per scope of one rate limit over its window, read from the ledger (GCRA
    spreads them smoothly, so a scope can be refused below `max_calls` after a burst)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=limit.window_s)
    counts: dict[str, int] = {}
    rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
        "debits", flat=True
    )
    for debits in rows.iterator():
        for debit in debits:
            if debit.get("kind") == "rate" and debit.get("limit") == limit.name:
                counts[debit["scope"]] = counts.get(debit["scope"], 0) + 1
    return [
        {"scope": scope, "used": used, "cap": limit.max_calls, "ratio": used / limit.max_calls}
        for scope, used in sorted(counts.items())
    ]


def spend_since(since: datetime) -> tuple[int, int]:
    """The fleet's spend as agent-saga's `get_fleet_budget` reports it, from the ledger: (units of
    budgeted arguments that allowed calls since `since` spent, each call counted once — its largest
    budget debit when several budgets matched it —, and how many distinct agents were allowed)."""
    units = 0
    agents: set[str] = set()
    rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
        "agent", "api_key_prefix", "debits"
    )
    for agent, key_prefix, debits in rows.iterator():
        agents.add(agent or f"key:{key_prefix}")
        units += max((int(d["amount"]) for d in debits if d.get("kind") == "budget"), default=0)
    return units, len(agents)


# -------------------------------------------------------------------------------------- the policies


def _check_common(name: Any, tool: Any, window_s: Any, per: Any) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX or "\x00" in name:
        raise FleetError("invalid_name", "name", f"name must be 1 to {NAME_MAX} characters")
    if not isinstance(tool, str) or not tool or len(tool) > 200 or "\x00" in tool:
        raise FleetError("invalid_tool", "tool", "tool must be a glob of 1 to 200 characters")
    if isinstance(window_s, bool) or not isinstance(window_s, int) or not 1 <= window_s <= MAX_WINDOW_S:
        raise FleetError(
            "invalid_window", "window_s", f"window_s must be a whole number from 1 to {MAX_WINDOW_S}"
        )
    if not isinstance(per, list) or len(per) > 4 or not gate.valid_per(per) or len(set(per)) != len(per):
        raise FleetError(
            "invalid_per", "per", 'per must be a list of distinct "agent", "api_key", "tool" or "arg:<name>"'
        )


Policy = TypeVar("Policy", BudgetLimit, RateLimit)


def _create_policy(
    tenant: Tenant,
    model: type[Policy],
    fields: dict[str, Any],
    *,
    actor: str,
    event: str,
    subject: str,
    values: Callable[[Policy], dict[str, Any]],
) -> Policy:
    """Create one budget or rate limit and record it (one transaction). The unique name is the
    database's to check: a name taken, even by a creation racing this one, is a 409."""
    with tenant_context(tenant):
        try:
            with transaction.atomic():  # a savepoint: the refused INSERT must not spoil the rest
                limit = model.objects.create(**fields)
        except IntegrityError:
            taken = f"a {subject.replace('_', ' ')} named '{fields['name']}' exists"
            raise FleetError("name_taken", "name", taken, status=409) from None
        record = {subject: limit.pk, "old": None, "new": values(limit)}
        append_server_record(tenant, event, record, actor=actor)
        _changed_after_commit(tenant)
    return limit


def budget_values(limit: BudgetLimit) -> dict[str, Any]:
    """A budget as audit records and the API show it."""
    return {
        "name": limit.name,
        "tool": limit.tool,
        "argument": limit.argument,
        "max_total": gate.from_units(gate.to_units(limit.max_total)),
        "window_s": limit.window_s,
        "per": list(limit.per),
        "on_cap": limit.on_cap,
    }


def rate_limit_values(limit: RateLimit) -> dict[str, Any]:
    """A rate limit as audit records and the API show it."""
    return {
        "name": limit.name,
        "tool": limit.tool,
        "max_calls": limit.max_calls,
        "window_s": limit.window_s,
        "per": list(limit.per),
    }


def create_budget(
    tenant: Tenant,
    *,
    actor: str,
    name: Any,
    max_total: Any,
    window_s: Any,
    tool: Any = "*",
    argument: Any = "amount",
    per: Any = None,
    on_cap: Any = OnCap.DENY,
) -> BudgetLimit:
    per = [] if per is None else per
    _check_common(name, tool, window_s, per)
    if not isinstance(argument, str) or not argument or len(argument) > 100:
        raise FleetError("invalid_argument_name", "argument", "argument must name the numeric argument")
    try:
        cap_units = gate.to_units(max_total if not isinstance(max_total, str) else Decimal(max_total))
    except (ValueError, ArithmeticError):
        raise FleetError("invalid_max_total", "max_total", "max_total must be a positive number") from None
    if cap_units <= 0:
        raise FleetError("invalid_max_total", "max_total", "max_total must be a positive number")
    if on_cap not in OnCap.values:
        raise FleetError("invalid_on_cap", "on_cap", f"on_cap must be one of {', '.join(OnCap.values)}")
    return _create_policy(
        tenant,
        BudgetLimit,
        {
            "name": name,
            "tool": tool,
            "argument": argument,
            "max_total": Decimal(cap_units) / gate.SCALE,
            "window_s": window_s,
            "per": per,
            "on_cap": on_cap,
        },
        actor=actor,
        event="FLEET_BUDGET_CREATED",
        subject="budget",
        values=budget_values,
    )


def _delete_policy(
    tenant: Tenant,
    model: type[BudgetLimit] | type[RateLimit],
    pk: int,
    *,
    actor: str,
    event: str,
    subject: str,
    values: Callable[[Any], dict[str, Any]],
) -> None:
    """Delete one budget or rate limit, recording what it was (one transaction)."""
    with tenant_context(tenant):
        limit = model.objects.select_for_update().filter(pk=pk).first()
        if limit is None:
            raise FleetError("not_found", "id", f"no such {subject.replace('_', ' ')}", status=404)
        old = values(limit)
        limit.delete()
        append_server_record(tenant, event, {subject: pk, "old": old, "new": None}, actor=actor)
        _changed_after_commit(tenant)


def delete_budget(tenant: Tenant, budget_id: int, *, actor: str) -> None:
    _delete_policy(
        tenant,
        BudgetLimit,
        budget_id,
        actor=actor,
        event="FLEET_BUDGET_DELETED",
        subject="budget",
        values=budget_values,
    )


def create_rate_limit(
    tenant: Tenant, *, actor: str, name: Any, max_calls: Any, window_s: Any, tool: Any = "*", per: Any = None
) -> RateLimit:
    per = [] if per is None else per
    _check_common(name, tool, window_s, per)
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or not 1 <= max_calls <= 10**9:
        raise FleetError("invalid_max_calls", "max_calls", "max_calls must be a whole number from 1 to 10^9")
    return _create_policy(
        tenant,
        RateLimit,
        {"name": name, "tool": tool, "max_calls": max_calls, "window_s": window_s, "per": per},
        actor=actor,
        event="FLEET_RATE_LIMIT_CREATED",
        subject="rate_limit",
        values=rate_limit_values,
    )


def delete_rate_limit(tenant: Tenant, rate_limit_id: int, *, actor: str) -> None:
    _delete_policy(
        tenant,
        RateLimit,
        rate_limit_id,
        actor=actor,
        event="FLEET_RATE_LIMIT_DELETED",
        subject="rate_limit",
        values=rate_limit_values,
    )


def halt_values(halt: Halt) -> dict[str, Any]:
    """A halt as audit records and the API show it."""
    return {
        "scope": halt.scope,
        "mode": halt.mode,
        "reason": halt.reason,
        "expires_at": halt.expires_at.isoformat() if halt.expires_at else None,
    }


def halt(
    tenant: Tenant, *, actor: str, scope: Any, reason: Any, mode: Any = HaltMode.HALT, ttl_s: Any = None
) -> Halt:
    """Put a kill switch in force (reason and actor required; optional TTL)."""
    if not isinstance(scope, str) or not gate.valid_halt_scope(scope) or "\x00" in scope:
        raise FleetError(
            "invalid_scope", "scope", 'scope must be "*", "tool:<glob>", "tag:<t>" or "agent:<name>"'
        )
    if mode not in HaltMode.values:
        raise FleetError("invalid_mode", "mode", f"mode must be one of {', '.join(HaltMode.values)}")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 500 or "\x00" in reason:
        raise FleetError("invalid_reason", "reason", "a reason of 1 to 500 characters is required")
    if ttl_s is not None and (
        isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 1 <= ttl_s <= MAX_TTL_S
    ):
        raise FleetError("invalid_ttl", "ttl_s", f"ttl_s must be a whole number from 1 to {MAX_TTL_S}")
    now = timezone.now()
    with tenant_context(tenant):
        row = Halt.objects.create(
            scope=scope,
            mode=mode,
            reason=reason,
            actor=actor,
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_s) if ttl_s else None,
        )
        append_server_record(
            tenant, "KILLSWITCH_ENGAGED", {"halt": row.pk, "old": None, "new": halt_values(row)}, actor=actor
        )
        _changed_after_commit(tenant)
    return row


def resume(tenant: Tenant, halt_id: int, *, actor: str) -> Halt | None:
    """Lift a halt; None when it was already lifted or had expired (a no-op records nothing)."""
    with tenant_context(tenant):
        row = Halt.objects.select_for_update().filter(pk=halt_id).first()
        if row is None:
            raise FleetError("not_found", "id", "no such halt", status=404)
        now = timezone.now()
        if row.lifted_at is not None or (row.expires_at is not None and row.expires_at <= now):
            return None
        row.lifted_at, row.lifted_by = now, actor
        row.save(update_fields=["lifted_at", "lifted_by"])
        append_server_record(
            tenant,
            "KILLSWITCH_RELEASED",
            {"halt": row.pk, "old": {"in_force": True}, "new": {"in_force": False}, "scope": row.scope},
            actor=actor,
        )
        _changed_after_commit(tenant)
    return row


def recent_denials(limit: int = 50) -> Sequence[GateDecision]:
    return list(GateDecision.objects.filter(decision=Decision.DENY).order_by("-decided_at")[:limit])


def quarantine(
    tenant: Tenant, saga_id: Any, *, actor: str, reason: Any, preemptive: Any = False
) -> Quarantine:
    """Set one saga aside (the gate refuses its steps; recovery will skip it). A saga no record
    has named yet is refused (404 `saga_not_found`) unless `preemptive` asks for exactly that: the
    quarantine then stands for the saga when it arrives, and says it was preemptive."""
    if not isinstance(saga_id, str) or not 0 < len(saga_id) <= 128 or "\x00" in saga_id:
        raise FleetError("invalid_saga_id", "saga_id", "saga_id must be 1 to 128 characters")
    if not isinstance(preemptive, bool):
        raise FleetError("invalid_preemptive", "preemptive", "preemptive must be true or false")
    with tenant_context(tenant):
        unknown = saga_selectors.saga(saga_id) is None
        if unknown and not preemptive:  # the path names no saga here: 404 before the body is judged
            raise FleetError(
                "saga_not_found",
                "saga_id",
                "no record names this saga yet; send preemptive: true to set it aside before it starts",
                status=404,
            )
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 500 or "\x00" in reason:
            raise FleetError("invalid_reason", "reason", "a reason of 1 to 500 characters is required")
        existing = Quarantine.objects.filter(saga_id=saga_id, released_at__isnull=True).first()
        if existing is not None:
            return existing
        row = Quarantine.objects.create(saga_id=saga_id, reason=reason, actor=actor, preemptive=unknown)
        append_server_record(
            tenant,
            "SAGA_QUARANTINED",
            {
                "saga_id": saga_id,
                "old": None,
                "new": {"quarantined": True, "reason": reason, "preemptive": unknown},
            },
            actor=actor,
        )
        _changed_after_commit(tenant)
    return row


DENIALS_KEPT_FOR = timedelta(days=30)


def prune_denials(tenant: Tenant, *, now: datetime | None = None) -> int:
    """Forget refusals older than DENIALS_KEPT_FOR (they debited nothing and are only shown as
    recent denials; the agent's WAL keeps its own GATE_DENY records). Allows are never pruned:
    they are the budget ledger."""
    cutoff = (now or timezone.now()) - DENIALS_KEPT_FOR
    with tenant_context(tenant):
        deleted, _ = GateDecision.objects.filter(decision=Decision.DENY, decided_at__lt=cutoff).delete()
    return deleted
