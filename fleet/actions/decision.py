"""The gate (`evaluate`) answers in this order, and the first refusal wins: kill switch → quarantine
→ circuit breakers (an open one refuses `circuit_open`; a half-open one lets one trial through)
→ budgets and rate limits (one atomic check-and-debit across every matching limit, all or nothing)
→ approval (`fleet.hooks`: the approvals app plugs its step in from above). Anything that cannot be
read is a refusal."""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core import availability, epoch, snapshots
from core.actors import Actor
from core.scoping import require_tenant
from fleet import gate, hooks, queries
from fleet.actions import breaker_states, reservations, snapshot
from fleet.actions.snapshot import Policies, held_policies, read_policies
from fleet.actions.store import gate_tag, get_store
from fleet.actions.writers import (
    Answer,
    LeanWriter,
    Retake,
    TransactionalWriter,
    Writer,
    deny_row,
    earlier_allow,
)
from fleet.gate import Debit, GateRequest, InvalidArgument
from fleet.models import Decision, GateDecision, HaltMode, OnCap
from fleet.stores import LimitStore, Outcome, RedisStore, StoreUnavailable
from tenants.models import Tenant

log = logging.getLogger(__name__)


# The cap of a budget an approved escalation lifts, for one call: above any window's possible sum
# (both stores keep sums exact below 2**53).
UNCAPPED = 2**52


_UNREAD: Any = object()


def evaluate(
    tenant: Tenant,
    request: GateRequest,
    *,
    actor: Actor,
    store: LimitStore | None = None,
    version: Any = _UNREAD,
) -> Answer:
    """The gate's answer for one call (see the module docstring for the order).

    `version`: the tenant's epoch when the caller already read it for this call (the lean HTTP
    path reads it once for its key check and the decision).

    The transport has entered the tenant (asserted here): the gate's fast route statement-scoped
    (`core.scoping.tenant_statements`: no transaction, each statement carries the tenant), a view
    in its transaction. On Redis with Postgres, outside any transaction, the decision takes the
    lean path (`LeanWriter`): policies from this process' snapshot (re-read when the epoch moved),
    one EVALSHA, and the ledger row in one statement batch that commits — with the epoch's GET,
    three round trips in all. A read the snapshot cannot answer (a drain checked against the
    ledger, an escalation) opens a transaction for that read; an approval to consult takes the
    whole decision again in a transaction (`TransactionalWriter`), as every decision on the other
    paths is taken."""
    require_tenant(tenant)
    availability.guard()  # a store known to be down: refused before anything is read
    store = store or get_store()
    if version is _UNREAD:
        version = epoch.read(tenant.pk)
    # The epoch read once for the whole decision: the approval step's snapshot reuses it.
    with snapshots.pinned_epoch(tenant.pk, version):
        if (
            isinstance(store, RedisStore)
            and queries.one_statement_ledger()
            and not connection.in_atomic_block
        ):
            answer = _decide(_Call(tenant, request, store, version, LeanWriter(tenant)))
            if not isinstance(answer, Retake):
                return answer
        with transaction.atomic():  # a savepoint of its own inside a caller's transaction
            answer = _decide(_Call(tenant, request, store, version, TransactionalWriter(tenant, actor=actor)))
        assert not isinstance(answer, Retake)  # only the lean writer retakes
        return answer


@dataclass
class _Call:
    """One decision in progress: what its steps read and what they leave for the next ones."""

    tenant: Tenant
    request: GateRequest
    store: LimitStore
    version: Any
    writer: Writer
    step: hooks.ApprovalStep | None = field(default_factory=hooks.approval_step)
    verdict: hooks.Verdict = hooks.NONE  # the approval step's, before the debit

    @cached_property
    def policies(self) -> Policies:
        held = held_policies(self.tenant, self.version)
        if held is not None:
            return held
        with self.writer.reading():
            return read_policies(self.tenant, self.version)


def _decide(call: _Call) -> Answer | Retake:
    """Each step answers (the first answer wins), asks for a retake (lean path only, before
    anything is debited or written) or passes the call on (None). The last step always answers."""
    for step in _STEPS:
        result = step(call)
        if result is not None:
            return result
    raise AssertionError("the gate's last step answers every call")


def _retried_allow(call: _Call) -> Answer | None:
    """The database store's answer to a retry of an allowed call (Redis answers a retry from its
    own idempotency key)."""
    if isinstance(call.store, RedisStore):
        return None
    return earlier_allow(call.request)


def _halted(call: _Call) -> Answer | None:
    """A kill switch in force that matches the call (`drain`: only sagas that were not already
    running when it began)."""
    now = timezone.now()
    for halt in call.policies.halts:
        if halt.expires_at is not None and halt.expires_at <= now:
            continue
        if not gate.halt_matches(halt.scope, call.request):
            continue
        detail = {"scope": halt.scope, "halt_reason": halt.reason, "retry_after": None}
        if halt.mode == HaltMode.HALT:
            return call.writer.deny(call.request, "halted", **detail)
        with call.writer.reading():
            known = _saga_known_before(call.request.saga_id, halt.created_at)
        if not known:
            return call.writer.deny(call.request, "draining", **detail)
    return None


def _saga_known_before(saga_id: str, moment: datetime) -> bool:
    """Was this saga already running when a drain began? (it asked the gate before then)"""
    return GateDecision.objects.filter(
        saga_id=saga_id, decision=Decision.ALLOW, decided_at__lt=moment
    ).exists()


def _quarantined(call: _Call) -> Answer | None:
    if call.request.saga_id in call.policies.quarantined:
        return call.writer.deny(call.request, "quarantined", retry_after=None)
    return None


def _circuit_open(call: _Call) -> Answer | None:
    """Breakers matching the call's tool (from the snapshot: no read when none matches or all are
    closed). Open, or half-open with its trial out: refused. Half-open with a trial due: the one
    call whose claim of the trial wins goes on (`breaker_states.claim_trial`, the breaker's row
    locked), the others are refused."""
    breakers = [
        b
        for b in call.policies.breakers
        if b.state != "closed" and gate.tool_matches(b.tool, call.request.tool)
    ]
    if not breakers:
        return None
    now_ms = int(time.time() * 1000)
    due = []
    for breaker in breakers:
        phase = gate.breaker_phase(breaker, now_ms)
        if phase == "trial_due" or (
            phase == "trial_running" and breaker.trial == (call.request.saga_id, call.request.step_id)
        ):
            due.append(breaker)
        elif phase != "closed":
            return _circuit_refusal(call, breaker, now_ms)
    for breaker in due:
        with call.writer.reading():
            admitted = breaker_states.claim_trial(call.tenant, breaker, call.request)
        if not admitted:
            return _circuit_refusal(call, breaker, now_ms)
    return None


def _circuit_refusal(call: _Call, breaker: gate.BreakerSpec, now_ms: int) -> Answer:
    detail = {
        "breaker": breaker.name,
        "scope": f"tool:{breaker.tool}",
        "message": f"circuit breaker '{breaker.name}' is open",
        "retry_after": gate.breaker_retry_after(breaker, now_ms),
    }
    return call.writer.deny(call.request, "circuit_open", **detail)


def _approval(call: _Call) -> Answer | Retake | None:
    """The approval step before anything is debited: a request pending or refused answers; an
    approved one goes on, to be consumed with the authorisation."""
    if call.step is None:
        return None
    escalating = any(
        s.kind == "budget" and s.on_cap == OnCap.ESCALATE and gate.tool_matches(s.tool, call.request.tool)
        for s in call.policies.specs
    )
    verdict = call.writer.approval_verdict(call.step, call.request, escalating=escalating)
    if isinstance(verdict, Retake):
        return verdict
    call.verdict = verdict
    if verdict.kind == "pending":
        return verdict.answer
    if verdict.kind == "refused":
        return deny_row(call.request, **verdict.answer)
    if verdict.kind == "consumed":
        return earlier_allow(call.request) or deny_row(call.request, "approval_consumed", retry_after=None)
    return None


def _debit_and_record(call: _Call) -> Answer:
    """One atomic check-and-debit of every limit the call meets, then the allow's ledger row (with
    the approvals it consumes). From here on something may be debited: no retake."""
    request, writer = call.request, call.writer
    try:
        debits = gate.debits_for(call.policies.specs, request, tenant_tag=gate_tag(call.tenant))
    except InvalidArgument as exc:
        detail = {"limit": exc.limit, "argument": exc.argument, "message": exc.detail, "retry_after": None}
        return writer.deny(request, "invalid_argument", **detail)
    if call.verdict.uncapped:
        # An approved escalation: these budgets' caps do not hold for this one call (it is still
        # debited, so its spend counts against everything after it).
        debits = [
            replace(d, cap=UNCAPPED) if d.kind == "budget" and d.limit in call.verdict.uncapped else d
            for d in debits
        ]
    decision_id = uuid.uuid4()
    try:
        outcome = call.store.check_and_debit(
            call.tenant.pk,
            debits,
            idempotency_key=request.idempotency_key,
            decision_id=str(decision_id),
            tag=gate_tag(call.tenant),
        )
    except StoreUnavailable as exc:
        outage = availability.failed(exc, probe=_redis_probe(call.store))
        if outage is not None:  # Redis unreachable: every call refused, fast, until it answers
            raise outage from exc
        log.warning("gate: limit store unavailable for tenant %s: %s", call.tenant.pk, exc)
        return writer.deny(request, "limit_store_unavailable", retry_after=1)
    if not outcome.allowed:
        return _refused_by_store(call, outcome, debits)
    if outcome.duplicate_of is not None:
        decision_id = uuid.UUID(outcome.duplicate_of)
        with writer.reading():
            existing = GateDecision.objects.filter(pk=decision_id).first()
        if existing is not None:
            return existing.answer()
        # The store debited under this id but its ledger row never committed: record it now
        # (the debit is already counted, so this allows nothing the counters did not).
    late = (time.monotonic() - outcome.debited_at) * 1000 > getattr(
        call.store, "commit_deadline_ms", math.inf
    )
    if outcome.debited_at and late:
        # Too late to be sure a rebuild fenced us in: refuse (the Redis debit stays, erring
        # toward refusal).
        return writer.deny(request, "limit_store_unavailable", retry_after=1)
    # A reservation keeps the store's clock at the debit: the bucket it settles in (a retry whose
    # first row never committed has no clock from the store: this process' stands in).
    store_ms = outcome.now_ms or int(time.time() * 1000)
    reservation = reservations.opened(request, debits, store_ms)
    return writer.allow(request, decision_id, debits, call.verdict.requests, call.step, detail=reservation)


def _refused_by_store(call: _Call, outcome: Outcome, debits: Sequence[Debit]) -> Answer:
    """The store refused: a budget with `on_cap=escalate` opens (or finds) an approval request,
    any other refusal is recorded as the gate's answer."""
    failed = outcome.failed
    assert failed is not None
    escalates = any(
        s.kind == "budget" and s.name == failed.limit and s.on_cap == OnCap.ESCALATE
        for s in call.policies.specs
    )
    if call.step is None or failed.kind != "budget" or not escalates:
        reason, detail = _store_refusal(outcome)
        return call.writer.deny(call.request, reason, **detail)
    with call.writer.reading():
        escalated = call.step.escalate(call.tenant, call.request, failed.limit, debits)
        if escalated.kind == "pending":
            return escalated.answer
        if escalated.kind == "refused":
            return deny_row(call.request, **escalated.answer)
        reason, detail = _store_refusal(outcome)
        return deny_row(call.request, reason, **detail)


def _store_refusal(outcome: Outcome) -> tuple[str, dict[str, Any]]:
    """The store's refusal as the gate's reason and detail."""
    failed = outcome.failed
    assert failed is not None
    retry = None if outcome.retry_after_ms is None else max(1, math.ceil(outcome.retry_after_ms / 1000))
    if failed.kind == "rate":
        return "rate_limited", {
            "limit": failed.limit,
            "scope": failed.scope,
            "remaining": 0,
            "retry_after": retry,
        }
    return "budget_exceeded", {
        "limit": failed.limit,
        "scope": failed.scope,
        "remaining": gate.from_units(max(0, failed.cap - outcome.used)),
        "requested": gate.from_units(failed.amount),
        "retry_after": retry,
    }


_STEPS: tuple[Callable[[_Call], Answer | Retake | None], ...] = (
    _retried_allow,
    _halted,
    _quarantined,
    _circuit_open,
    _approval,
    _debit_and_record,
)


def _redis_probe(store: LimitStore) -> Callable[[], None] | None:
    """What tells that the gate's Redis is back (core.availability probes it while the
    gate refuses): it answers and the counters of every tenant this process served recently are
    ready, so the first calls after it do not wait out a rebuild's fence (`RedisStore.make_ready`)."""
    if not isinstance(store, RedisStore):
        return None

    def probe() -> None:
        tags = snapshot.served_tags()
        store.make_ready([(int(tag[1:].partition(".")[0]), tag) for tag in tags])  # gate_tag's form

    return probe
