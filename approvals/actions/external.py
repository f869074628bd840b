"""Requests another system asked for: agent-saga's `APPROVAL_REQUESTED` records, which
approvals/compat.py reads from shipped WALs. Bound as the gate's own requests are:

- **The requester** is the person who created the API key that shipped the record
  (`ApiKey.created_by`, as `requester_of` finds it for the gate's requests): they cannot vote on it
  (403 `requester_cannot_vote`). A key nobody created (the `create_api_key` command) has no
  requester; nobody is then excluded, and the request says so rather than leaving it unsaid: its
  `APPROVAL_REQUESTED` record carries `"requester": null` beside the shipping key.
- **The action**: the request is bound to the digest of (tool, context, amount, rule), as
  `action_of` computes it. The same request id again with the same action is the same request (a
  WAL shipped twice). With another action it is refused: the attempt is kept as evidence
  (`APPROVAL_CONFLICT`, with both digests and the refused action), and a request still pending or
  approved is denied (`decided_by` `system:conflict`), so that id is never answered GRANTED again:
  the agent waiting on it could be about to run either action.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane.chain import canonical
from sagaplane.events import Event

from approvals.actions.requests import BUDGET_RULES, action_of, announce, decide, record, requester_of
from approvals.models import ApprovalRequest, Source, Status
from core.actors import Actor
from core.scoping import require_tenant
from fleet import services as fleet
from tenants.actors import system_actor, user_actor
from tenants.models import Tenant

CONFLICT_ACTOR = system_actor("conflict")


def open_external(
    tenant: Tenant,
    *,
    external_id: str,
    saga_id: str,
    step_id: str,
    tool: str,
    args: Mapping[str, Any],
    rule: str,
    reason: str,
    expires_at: datetime,
    api_key_prefix: str,
    actor: Actor,
) -> ApprovalRequest:
    """The request for agent-saga's `external_id`: opened (one approval from approvers, admins or
    owners: BUDGET_RULES), found again for the same action, or refused for another (module
    docstring). `api_key_prefix`: the key that shipped the record ("" when none did)."""
    safe_args = json.loads(json.dumps(dict(args), default=str))
    action, digest = action_of(tool, safe_args, safe_args.get("amount"), f"agent-saga:{rule}")
    require_tenant(tenant)
    existing = _known(tenant, external_id, action, digest, actor=actor)
    if existing is not None:
        return existing
    request_id = hashlib.sha256(canonical([fleet.gate_tag(tenant), "agent-saga", external_id])).hexdigest()[
        :32
    ]
    now = timezone.now()
    rules = {**BUDGET_RULES, "ttl_s": max(1, int((expires_at - now).total_seconds()))}
    requester = requester_of(api_key_prefix)
    try:
        with transaction.atomic():
            row = ApprovalRequest.objects.create(
                id=request_id,
                source=Source.AGENT_SAGA,
                external_id=external_id,
                saga_id=saga_id,
                step_id=step_id,
                tool=tool,
                args=safe_args,
                args_digest=hashlib.sha256(canonical(safe_args)).hexdigest(),
                action=action,
                action_digest=digest,
                policy_name=rule or "agent-saga",
                rules=rules,
                api_key_prefix=api_key_prefix,
                requester_user_id=requester,
                required=1,
                note=reason,
                created_at=now,
                expires_at=expires_at,
            )
    except IntegrityError:  # the same record racing itself: judged against the first
        found = _known(tenant, external_id, action, digest, actor=actor)
        assert found is not None  # the unique (tenant, external_id) row that refused this one
        return found
    record(
        tenant,
        Event.APPROVAL_REQUESTED,
        row,
        {
            "source": Source.AGENT_SAGA.value,
            "external_id": external_id,
            "action": action,
            "policy": row.policy_name,
            "required": 1,
            "expires_at": expires_at.isoformat(),
            "api_key": api_key_prefix,
            "requester": _username(requester),
        },
        actor=actor,
    )
    announce(tenant, row, "created")
    return row


def _known(
    tenant: Tenant, external_id: str, action: dict[str, Any], digest: str, *, actor: Actor
) -> ApprovalRequest | None:
    """The request already open for `external_id` (locked), after refusing another action for it."""
    existing = ApprovalRequest.objects.select_for_update().filter(external_id=external_id).first()
    if existing is not None and existing.action_digest != digest:
        _refuse_conflict(tenant, existing, action, digest, actor=actor)
    return existing


def _username(user_id: int | None) -> str | None:
    if user_id is None:
        return None
    name = get_user_model().objects.filter(pk=user_id).values_list("username", flat=True).first()
    return str(user_actor(str(name)))  # the request's decided_by


def _refuse_conflict(
    tenant: Tenant, row: ApprovalRequest, action: dict[str, Any], digest: str, *, actor: Actor
) -> None:
    """Another action under a known request id (inside the tenant, the row locked)."""
    record(
        tenant,
        Event.APPROVAL_CONFLICT,
        row,
        {
            "external_id": row.external_id,
            "refused_action": json.loads(json.dumps(action, default=str)),
            "refused_action_digest": digest,
            "status_before": row.status,
        },
        actor=actor,
    )
    if row.status in (Status.PENDING, Status.APPROVED):
        note = "another action was requested under this request id; no decision stands for it"
        decide(tenant, row, Status.DENIED, timezone.now(), by=str(CONFLICT_ACTOR), note=note, actor=actor)
