"""Approval requests: the action a request is bound to, opening one for a call, deciding it,
and the record and announcement of every change to it.

Every record about a request carries the saga id, so it is part of that saga's disclosure and
counted by its seal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane.chain import canonical
from sagaplane.events import Event

from approvals import hooks, wake
from approvals.actions.policies import DEFAULT_ROLES
from approvals.models import ApprovalPolicy, ApprovalRequest, Status, Vote
from core.actionaudit import append_server_record
from core.actors import Actor
from core.postcommit import after_commit
from fleet import services as fleet
from fleet.gate import GateRequest
from tenants.models import ApiKey, Tenant

# What a budget at its cap with on_cap=escalate asks for (no policy names the approvers).
BUDGET_RULES: dict[str, Any] = {
    "required": 1,
    "eligible_roles": DEFAULT_ROLES,
    "eligible_members": [],
    "passkey_only": False,
    "ttl_s": 3600,
    "execution_window_s": 300,
    "warn_before_s": 300,
    "escalation": [],
}


def action_of(tool: str, args: Mapping[str, Any], amount: Any, policy_key: str) -> tuple[dict[str, Any], str]:
    """The canonical action an approval is bound to, and its SHA-256 (hex)."""
    action = {"tool": tool, "arguments": dict(args), "amount": amount, "policy": policy_key}
    return action, hashlib.sha256(canonical(action)).hexdigest()


def request_id_for(tenant: Tenant, saga_id: str, step_id: str, tool: str, action_digest: str) -> str:
    """Deterministic: a retried step finds its request; any other call (other arguments, another
    amount, the policy edited since) gets another."""
    material = [fleet.gate_tag(tenant), saga_id, step_id, tool, action_digest]
    return hashlib.sha256(canonical(material)).hexdigest()[:32]


def seconds_left(moment: datetime | None, now: datetime | None = None) -> float | None:
    if moment is None:
        return None
    return max(0.0, round((moment - (now or timezone.now())).total_seconds(), 3))


def request_values(row: ApprovalRequest, *, now: datetime | None = None) -> dict[str, Any]:
    """A request as the API, the hooks and the live events show it."""
    return {
        "id": row.pk,
        "status": row.status,
        "source": row.source,
        "external_id": row.external_id,
        "saga_id": row.saga_id,
        "step_id": row.step_id,
        "tool": row.tool,
        "semantics": row.semantics,
        "args": row.args,
        "action": row.action,
        "action_digest": row.action_digest,
        "policy": row.policy_name,
        "policy_version": row.policy_version,
        "required": row.required,
        "approvals": row.approvals,
        "passkey_only": bool(row.rules.get("passkey_only")),
        "limits": list(row.limits),
        "agent": row.agent,
        "reason": row.reason,
        "created_at": row.created_at.isoformat(),
        "expires_at": row.expires_at.isoformat(),
        "expires_in": seconds_left(row.expires_at, now) if row.status == Status.PENDING else None,
        "escalation_level": row.escalation_level,
        "decided_at": row.decided_at.isoformat() if row.decided_at else None,
        "decided_by": row.decided_by,
        "note": row.note,
        "break_glass": row.break_glass,
        "execute_by": row.execute_by.isoformat() if row.execute_by else None,
        "consumed_at": row.consumed_at.isoformat() if row.consumed_at else None,
        "authorization_id": row.authorization_id,
    }


def vote_values(vote: Vote) -> dict[str, Any]:
    return {
        "voter": vote.voter,
        "role": vote.role,
        "choice": vote.choice,
        "note": vote.note,
        "break_glass": vote.break_glass,
        "passkey": vote.assertion is not None,
        "at": vote.created_at.isoformat(),
    }


def record(tenant: Tenant, event: str, row: ApprovalRequest, fields: dict[str, Any], *, actor: Actor) -> None:
    """A request's record in the server stream: it carries the saga id (the saga's disclosure
    counts it) and the request and action it is about."""
    append_server_record(
        tenant,
        event,
        {
            "saga_id": row.saga_id,
            "step_id": row.step_id,
            "tool": row.tool,
            "approval_id": row.pk,
            "action_digest": row.action_digest,
            **fields,
        },
        actor=actor,
    )


def announce(
    tenant: Tenant, row: ApprovalRequest, kind: hooks.Kind, detail: dict[str, Any] | None = None
) -> None:
    """After the commit: wake the long-polls waiting on this request, tell the dashboards, and run
    the subscribers' hooks."""
    values = request_values(row)
    hooks.emit(hooks.ApprovalEvent(tenant, kind, values, dict(detail or {})))
    tenant_id, request_id = tenant.pk, row.pk

    after_commit("approval wake-up", lambda: wake.notify(tenant_id, request_id))
    message = {"type": "approval.event", "kind": kind, "approval": values}
    after_commit("approval live event", lambda: _publish(tenant_id, message))


def _publish(tenant_id: int, message: dict[str, Any]) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from sagas.services import tenant_group

    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(tenant_group(tenant_id), message)


def requester_of(api_key_prefix: str) -> int | None:
    if not api_key_prefix:
        return None
    return ApiKey.objects.filter(prefix=api_key_prefix).values_list("created_by_id", flat=True).first()


def open_request(
    tenant: Tenant,
    request: GateRequest,
    *,
    source: str,
    policy: ApprovalPolicy | None,
    rules: dict[str, Any],
    policy_key: str,
    amount: Any,
    limits: Sequence[str] = (),
    actor: Actor,
) -> ApprovalRequest:
    """The request for this exact call: found (a retry), or opened and recorded."""
    action, digest = action_of(request.tool, request.args, amount, policy_key)
    request_id = request_id_for(tenant, request.saga_id, request.step_id, request.tool, digest)
    existing = ApprovalRequest.objects.filter(pk=request_id).first()
    if existing is not None:
        return existing
    now = timezone.now()
    try:
        with transaction.atomic():
            row = ApprovalRequest.objects.create(
                id=request_id,
                source=source,
                saga_id=request.saga_id,
                step_id=request.step_id,
                tool=request.tool,
                semantics=request.semantics,
                args=json.loads(json.dumps(dict(request.args), default=str)),
                args_digest=request.args_digest,
                action=json.loads(json.dumps(action, default=str)),
                action_digest=digest,
                policy=policy,
                policy_name=policy.name if policy is not None else (limits[0] if limits else ""),
                policy_version=policy.version if policy is not None else 0,
                rules=rules,
                limits=list(limits),
                agent=request.agent,
                reason=request.reason,
                api_key_prefix=request.api_key_prefix,
                requester_user_id=requester_of(request.api_key_prefix),
                idempotency_key=request.idempotency_key,
                required=rules["required"],
                created_at=now,
                expires_at=now + timedelta(seconds=rules["ttl_s"]),
            )
    except IntegrityError:
        # The same call racing itself: the first one opened it.
        return ApprovalRequest.objects.get(pk=request_id)
    record(
        tenant,
        Event.APPROVAL_REQUESTED,
        row,
        {
            "source": source,
            "action": row.action,
            "policy": row.policy_name,
            "policy_version": row.policy_version,
            "required": row.required,
            "passkey_only": bool(rules.get("passkey_only")),
            "expires_at": row.expires_at.isoformat(),
            "agent": row.agent,
            "api_key": row.api_key_prefix,
            **({"reason": row.reason} if row.reason else {}),
        },
        actor=actor,
    )
    announce(tenant, row, "created")
    return row


def decide(
    tenant: Tenant, row: ApprovalRequest, status: str, now: datetime, *, by: str, note: str, actor: Actor
) -> None:
    row.status, row.decided_at, row.decided_by, row.note = status, now, by, note
    row.save(update_fields=["status", "decided_at", "decided_by", "note", "break_glass", "execute_by"])
    event = {Status.APPROVED.value: Event.APPROVAL_GRANTED, Status.DENIED.value: Event.APPROVAL_DENIED}.get(
        status, Event.APPROVAL_EXPIRED
    )
    fields: dict[str, Any] = {
        "decided_by": by,
        "note": note,
        "approvals": row.approvals,
        "required": row.required,
    }
    if status == Status.APPROVED:
        fields["execute_by"] = row.execute_by.isoformat() if row.execute_by else None
        fields["break_glass"] = row.break_glass
    record(tenant, event, row, fields, actor=actor)
    announce(tenant, row, "decided")
