"""How a decision reads what its snapshot cannot answer and writes its answer: one writer per path.

- `TransactionalWriter`: the decision runs inside the tenant's transaction; refusals and allows
  are ORM rows, an allow commits with the approvals it consumes.
- `LeanWriter`: outside any transaction (Redis with Postgres), in the transport's statement-scoped
  block (`core.scoping.tenant_statements`: each statement carries the tenant): a read the snapshot
  cannot answer opens a transaction for that read alone, and each answer is one statement batch
  (`write_lean`). What it cannot do (an approval that must read or write) it answers `RETAKE`,
  before anything is debited: the whole decision is then taken again transactionally.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final, Protocol

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from core import availability
from core.actors import Actor
from core.scoping import NeedsDatabase, scoped_without_database
from fleet import hooks, queries
from fleet.gate import Debit, GateRequest
from fleet.models import Decision, GateDecision, allow_answer
from tenants.models import Tenant

log = logging.getLogger(__name__)

Answer = dict[str, Any]


class Retake:
    """A step's verdict that the lean path cannot decide this call (see the module docstring)."""


RETAKE: Final = Retake()


class Writer(Protocol):
    def reading(self) -> AbstractContextManager[Any]:
        """Where a read the policy snapshot cannot answer runs (the tenant's scope)."""
        ...

    def deny(self, request: GateRequest, reason: str, **detail: Any) -> Answer:
        """Record a refusal and answer it."""
        ...

    def approval_verdict(
        self, step: hooks.ApprovalStep, request: GateRequest, *, escalating: bool
    ) -> hooks.Verdict | Retake:
        """The approval step's verdict before the debit (`RETAKE`: not on this path)."""
        ...

    def allow(
        self,
        request: GateRequest,
        decision_id: uuid.UUID,
        debits: Sequence[Debit],
        approvals: Sequence[str],
        step: hooks.ApprovalStep | None,
        *,
        detail: dict[str, Any] | None = None,
    ) -> Answer:
        """Record the allow (consuming `approvals` with it, `detail` beside them: a reservation's)
        and answer it."""
        ...


def deny_row(request: GateRequest, reason: str, **detail: Any) -> Answer:
    """A refusal as an ORM row, in the caller's transaction."""
    row = GateDecision.objects.create(
        idempotency_key=request.idempotency_key,
        saga_id=request.saga_id,
        step_id=request.step_id,
        tool=request.tool,
        agent=request.agent,
        api_key_prefix=request.api_key_prefix,
        args_digest=request.args_digest,
        decision=Decision.DENY,
        reason=reason,
        detail=detail,
    )
    return row.answer()


def earlier_allow(request: GateRequest) -> Answer | None:
    """The answer of this very call when an earlier one was allowed (a retry)."""
    earlier = GateDecision.objects.filter(
        idempotency_key=request.idempotency_key, decision=Decision.ALLOW
    ).first()
    return None if earlier is None else earlier.answer()


class _NotConsumable(Exception):
    """An approval read as usable was used or lapsed before this authorisation could take it
    (raised inside the allow's savepoint to roll it back)."""


class TransactionalWriter:
    def __init__(self, tenant: Tenant, *, actor: Actor) -> None:
        self.tenant, self.actor = tenant, actor

    def reading(self) -> AbstractContextManager[Any]:
        return nullcontext()  # already inside the tenant's transaction

    def deny(self, request: GateRequest, reason: str, **detail: Any) -> Answer:
        return deny_row(request, reason, **detail)

    def approval_verdict(
        self, step: hooks.ApprovalStep, request: GateRequest, *, escalating: bool
    ) -> hooks.Verdict | Retake:
        return step.before_debit(self.tenant, request, escalating=escalating)

    def allow(
        self,
        request: GateRequest,
        decision_id: uuid.UUID,
        debits: Sequence[Debit],
        approvals: Sequence[str],
        step: hooks.ApprovalStep | None,
        *,
        detail: dict[str, Any] | None = None,
    ) -> Answer:
        try:
            with transaction.atomic():
                row = GateDecision.objects.create(
                    id=decision_id,
                    idempotency_key=request.idempotency_key,
                    saga_id=request.saga_id,
                    step_id=request.step_id,
                    tool=request.tool,
                    agent=request.agent,
                    api_key_prefix=request.api_key_prefix,
                    args_digest=request.args_digest,
                    decision=Decision.ALLOW,
                    debits=[d.as_ledger() for d in debits],
                    detail={**(detail or {}), **({"approvals": list(approvals)} if approvals else {})},
                )
                if (
                    approvals
                    and step is not None
                    and not step.consume(
                        self.tenant, approvals, authorization_id=str(decision_id), actor=self.actor
                    )
                ):
                    raise _NotConsumable
        except _NotConsumable:
            # Used or lapsed since it was read (a racing call took it): this call starts nothing.
            return earlier_allow(request) or deny_row(request, "approval_consumed", retry_after=None)
        except IntegrityError:
            # The same call allowed meanwhile (a retry racing itself, or one whose Redis key had
            # expired): the first allow stands; this debit stays counted, erring toward refusal.
            first = GateDecision.objects.get(idempotency_key=request.idempotency_key, decision=Decision.ALLOW)
            return first.answer()
        return row.answer()


class LeanWriter:
    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant

    def reading(self) -> AbstractContextManager[Any]:
        # The tenant is the transport's (each statement carries it); the read gets a transaction
        # of its own, as a row it locks (a breaker's trial) needs one.
        return transaction.atomic()

    def deny(self, request: GateRequest, reason: str, **detail: Any) -> Answer:
        return write_lean(self.tenant, request, Decision.DENY, reason=reason, detail=detail)

    def approval_verdict(
        self, step: hooks.ApprovalStep, request: GateRequest, *, escalating: bool
    ) -> hooks.Verdict | Retake:
        # Usually answered from the approvals' own snapshot; what must read or write (a policy
        # that applies, an earlier escalation) runs in the tenant's transaction with the decision.
        try:
            with scoped_without_database(self.tenant):
                verdict = step.before_debit(self.tenant, request, escalating=escalating)
        except NeedsDatabase:
            return RETAKE
        return verdict if verdict.kind == "none" else RETAKE

    def allow(
        self,
        request: GateRequest,
        decision_id: uuid.UUID,
        debits: Sequence[Debit],
        approvals: Sequence[str],
        step: hooks.ApprovalStep | None,
        *,
        detail: dict[str, Any] | None = None,
    ) -> Answer:
        assert not approvals  # an approval to consume retakes the decision transactionally
        return write_lean(
            self.tenant, request, Decision.ALLOW, decision_id=decision_id, debits=debits, detail=detail
        )


def write_lean(
    tenant: Tenant,
    request: GateRequest,
    decision: Decision,
    *,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    decision_id: uuid.UUID | None = None,
    debits: Sequence[Debit] = (),
) -> Answer:
    """Write one decision in one round trip (`fleet.queries.insert_decision`) outside any
    transaction, and answer it. An allow is answered only once its row has committed; a ledger
    that cannot be written refuses (`limit_store_unavailable`: any debit already made stays,
    erring toward refusal). The transport's statement-scoped block carries the tenant (the
    decision, this writer's only caller, asserted it)."""
    detail = detail or {}
    row_id = decision_id or uuid.uuid4()
    try:
        inserted = queries.insert_decision(
            tenant.pk,
            request,
            decision,
            row_id=row_id,
            reason=reason,
            detail_json=json.dumps(detail, cls=DjangoJSONEncoder),
            debits_json=json.dumps([d.as_ledger() for d in debits]),
            decided_at=timezone.now(),
        )
    except DatabaseError as exc:
        outage = availability.failed(exc)
        if outage is not None:  # any debit already made stays: erring toward refusal
            raise outage from exc
        log.warning("gate: ledger unavailable for tenant %s: %s", tenant.pk, exc)
        if decision == Decision.DENY:
            return {"decision": "deny", "reason": reason, **detail}
        return {"decision": "deny", "reason": "limit_store_unavailable", "retry_after": 1}
    if decision == Decision.DENY:
        return {"decision": "deny", "reason": reason, **detail, "decision_id": str(row_id)}
    if not inserted:
        # The same call allowed meanwhile (a retry racing itself): the first allow stands; this
        # debit stays counted, erring toward refusal.
        first = GateDecision.objects.get(idempotency_key=request.idempotency_key, decision=Decision.ALLOW)
        return first.answer()
    return allow_answer(row_id, detail)
