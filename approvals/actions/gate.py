"""The gate's approval step: the request a call must wait on, and its consumption.

The gate reaches this module through `fleet.hooks` (`GateStep`, registered in AppConfig.ready):
fleet never imports approvals.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone
from sagaplane.events import Event

from approvals.actions.policies import matching_policy, rules_of
from approvals.actions.requests import BUDGET_RULES, announce, open_request, record, seconds_left
from approvals.actions.snapshot import enabled_policies
from approvals.models import ApprovalPolicy, ApprovalRequest, Source, Status
from core.actors import Actor
from fleet import hooks as gate_hooks
from fleet.gate import Debit, GateRequest, from_units
from tenants.actors import named_actor
from tenants.models import Tenant


def _pending_answer(row: ApprovalRequest) -> dict[str, Any]:
    return {
        "decision": "pending_approval",
        "reason": "approval_required",
        "approval_id": row.pk,
        "policy": row.policy_name,
        "required": row.required,
        "approvals": row.approvals,
        "passkey_only": bool(row.rules.get("passkey_only")),
        "expires_at": row.expires_at.isoformat(),
        "expires_in": seconds_left(row.expires_at),
        "wait": f"/api/v1/approvals/{row.pk}/wait",
        "retry_after": 1,
    }


def _refusal(row: ApprovalRequest, now: datetime) -> dict[str, Any] | None:
    """Why this request stops the call now (None: it does not)."""
    if row.status == Status.DENIED:
        return {"reason": "approval_denied", "approval_id": row.pk, "note": row.note, "retry_after": None}
    if row.status in (Status.EXPIRED, Status.LAPSED):
        return {"reason": "approval_expired", "approval_id": row.pk, "retry_after": None}
    if row.status == Status.PENDING and row.expires_at <= now:
        return {"reason": "approval_expired", "approval_id": row.pk, "retry_after": None}
    if row.status == Status.APPROVED and row.execute_by is not None and row.execute_by <= now:
        return {"reason": "approval_expired", "approval_id": row.pk, "retry_after": None}
    return None


def _verdict(rows: Sequence[ApprovalRequest]) -> gate_hooks.Verdict:
    if not rows:
        return gate_hooks.NONE
    now = timezone.now()
    for row in rows:
        refusal = _refusal(row, now)
        if refusal is not None:
            return gate_hooks.Verdict("refused", answer=refusal)
    for row in rows:
        if row.status == Status.PENDING:
            return gate_hooks.Verdict("pending", answer=_pending_answer(row))
    if any(row.status == Status.CONSUMED for row in rows):
        return gate_hooks.Verdict("consumed")
    uncapped = frozenset(limit for row in rows if row.source == Source.BUDGET for limit in row.limits)
    return gate_hooks.Verdict("approved", requests=tuple(row.pk for row in rows), uncapped=uncapped)


class GateStep:
    """The gate's approval step (`fleet.hooks.ApprovalStep`)."""

    actor = named_actor("gate")

    def governed_tools(self) -> list[str]:
        return sorted(set(ApprovalPolicy.objects.filter(enabled=True).values_list("tool", flat=True)))

    def before_debit(self, tenant: Tenant, request: GateRequest, *, escalating: bool) -> gate_hooks.Verdict:
        rows: list[ApprovalRequest] = []
        policy = matching_policy(enabled_policies(tenant), request)
        if policy is not None:
            rows.append(
                open_request(
                    tenant,
                    request,
                    source=Source.POLICY,
                    policy=policy,
                    rules=rules_of(policy),
                    policy_key=f"policy:{policy.pk}:v{policy.version}",
                    amount=request.args.get("amount"),
                    actor=self.actor,
                )
            )
        if not escalating:
            return _verdict(rows)
        # A budget escalated earlier for this very call (its cap lifts once it is approved).
        rows.extend(
            ApprovalRequest.objects.filter(
                source=Source.BUDGET,
                saga_id=request.saga_id,
                step_id=request.step_id,
                tool=request.tool,
                args_digest=request.args_digest,
            ).order_by("created_at", "pk")
        )
        return _verdict(rows)

    def escalate(
        self, tenant: Tenant, request: GateRequest, limit: str, debits: Sequence[Debit]
    ) -> gate_hooks.Verdict:
        debit = next(d for d in debits if d.kind == "budget" and d.limit == limit)
        row = open_request(
            tenant,
            request,
            source=Source.BUDGET,
            policy=None,
            rules=dict(BUDGET_RULES),
            policy_key=f"budget:{limit}:{debit.cap}",
            amount=from_units(debit.amount),
            limits=[limit],
            actor=self.actor,
        )
        return _verdict([row])

    def consume(
        self, tenant: Tenant, requests: Sequence[str], *, authorization_id: str, actor: Actor
    ) -> bool:
        now = timezone.now()
        for request_id in requests:
            taken = ApprovalRequest.objects.filter(
                pk=request_id, status=Status.APPROVED, execute_by__gt=now
            ).update(status=Status.CONSUMED, consumed_at=now, authorization_id=authorization_id)
            if taken != 1:
                return False
        for row in ApprovalRequest.objects.filter(pk__in=list(requests)):
            record(tenant, Event.APPROVAL_CONSUMED, row, {"authorization_id": authorization_id}, actor=actor)
            announce(tenant, row, "consumed", {"authorization_id": authorization_id})
        return True
