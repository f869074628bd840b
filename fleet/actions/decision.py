"""The gate (`evaluate`) answers in this order, and the first refusal wins: kill switch → quarantine
→ budgets and rate limits (one atomic check-and-debit across every matching limit, all or nothing)
→ approval (`fleet.hooks`: the approvals app plugs its step in from above). Anything that cannot be
read is a refusal."""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane import availability
from fleet import gate, hooks
from fleet.actions import snapshot
from fleet.actions.lean_ledger import write_lean
from fleet.actions.snapshot import _decision_epoch, held_policies, read_policies
from fleet.actions.store import gate_tag, get_store
from fleet.gate import Debit, GateRequest, InvalidArgument
from fleet.models import Decision, GateDecision, HaltMode, OnCap
from fleet.stores import LimitStore, Outcome, RedisStore, StoreUnavailable
from tenants import epoch
from tenants.models import Tenant
from tenants.scoping import NeedsDatabase, scoped_without_database, tenant_context

log = logging.getLogger(__name__)


# The cap of a budget an approved escalation lifts, for one call: above any window's possible sum
# (both stores keep sums exact below 2**53).
UNCAPPED = 2**52


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


# ------------------------------------------------------------------------------------------ the gate


_UNREAD: Any = object()


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
    `write_lean`; `_NeedsTransaction` may be raised only before anything is debited or written."""
    key_prefix = request.api_key_prefix

    def database() -> Any:
        return tenant_context(tenant) if lean else nullcontext()

    def deny(reason: str, **detail: Any) -> dict[str, Any]:
        if lean:
            return write_lean(tenant, request, Decision.DENY, reason=reason, detail=detail)
        return _deny(request, reason, actor_prefix=key_prefix, **detail)

    if not isinstance(store, RedisStore):
        # Redis answers a retry from its own idempotency key; the database store asks here.
        earlier = GateDecision.objects.filter(
            idempotency_key=request.idempotency_key, decision=Decision.ALLOW
        ).first()
        if earlier is not None:
            return earlier.answer()
    policies = held_policies(tenant, version)
    if policies is None:
        with database():
            policies = read_policies(tenant, version)
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
        return write_lean(tenant, request, Decision.ALLOW, decision_id=decision_id, debits=debits)
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
        tags = snapshot.served_tags()
        store.make_ready([(int(tag[1:].partition(".")[0]), tag) for tag in tags])  # gate_tag's form

    return probe


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
