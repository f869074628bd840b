"""Every state change of approvals: policies, requests, votes, consumption, expiry and escalation.

Each change takes a keyword-only `actor` and appends its record (old and new values for policies)
to the tenant's server stream in the same transaction. Every record about a request carries the
saga id, so it is part of that saga's disclosure and counted by its seal.

The gate reaches this module through `fleet.hooks` (`GateStep`, registered in AppConfig.ready):
fleet never imports approvals.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from sagaplane.chain import canonical

from approvals import hooks, predicates, wake
from approvals.models import (
    ApprovalPolicy,
    ApprovalRequest,
    Source,
    Status,
    Vote,
    VoteChallenge,
    VoteChoice,
)
from audit.services import append_server_record
from controlplane.errors import DomainError
from controlplane.postcommit import after_commit
from core.snapshots import SnapshotCache
from fleet import hooks as gate_hooks
from fleet import services as fleet
from fleet.gate import Debit, GateRequest, from_units, tool_matches
from tenants.actors import user_actor
from tenants.models import ApiKey, Membership, Role, Tenant
from tenants.scoping import tenant_context

NAME_MAX = 100
MAX_TTL_S = 30 * 24 * 3600
MAX_WINDOW_S = 7 * 24 * 3600
MAX_APPROVALS = 20
MAX_LEVELS = 5
NOTE_MAX = 1000
ASSERTION_MAX_BYTES = 32 * 1024
CHALLENGE_TTL = timedelta(minutes=5)
SEMANTICS = ("PREVIEW", "REVERSIBLE", "COMPENSABLE", "IRREVERSIBLE")
DEFAULT_ROLES = [Role.APPROVER.value, Role.ADMIN.value, Role.OWNER.value]
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
OPEN = (Status.PENDING, Status.APPROVED)


class ApprovalError(DomainError):
    """A refused change, with a machine-readable code and the field at fault."""

    def __init__(self, code: str, detail: str, *, status: int = 400, field: str | None = None) -> None:
        if field is None:
            super().__init__(status, code, detail)
        else:
            super().__init__(status, code, detail, field=field)


# ------------------------------------------------------------------------------------------ policies


def policy_values(policy: ApprovalPolicy) -> dict[str, Any]:
    """A policy as audit records and the API show it."""
    return {
        "name": policy.name,
        "tool": policy.tool,
        "semantics": list(policy.semantics),
        "predicates": list(policy.predicates),
        "required_approvals": policy.required_approvals,
        "eligible_roles": list(policy.eligible_roles),
        "eligible_members": list(policy.eligible_members),
        "passkey_only": policy.passkey_only,
        "ttl_s": policy.ttl_s,
        "execution_window_s": policy.execution_window_s,
        "warn_before_s": policy.warn_before_s,
        "escalation": list(policy.escalation),
        "enabled": policy.enabled,
        "version": policy.version,
    }


def _int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApprovalError("invalid", f"{field}: a whole number from {low} to {high}", field=field)
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ApprovalError("invalid", f"{field}: true or false", field=field)
    return value


def _roles(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(r, str) and r in Role.values for r in value):
        raise ApprovalError("invalid", f"{field}: a list of roles ({', '.join(Role.values)})", field=field)
    return sorted(set(value))


def _members(value: Any, field: str) -> list[int]:
    """Named members: user ids or e-mail addresses of the active tenant's members."""
    if not isinstance(value, list) or len(value) > 100:
        raise ApprovalError("invalid", f"{field}: a list of at most 100 members", field=field)
    ids: set[int] = set()
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            found = Membership.objects.filter(user_id=item).values_list("user_id", flat=True).first()
        elif isinstance(item, str) and 0 < len(item) <= 254 and "\x00" not in item:
            found = (
                Membership.objects.filter(user__email__iexact=item).values_list("user_id", flat=True).first()
            )
        else:
            found = None
        if found is None:
            raise ApprovalError("unknown_member", f"{field}: {item!r} is not a member", field=field)
        ids.add(found)
    return sorted(ids)


def _escalation(value: Any, ttl_s: int) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_LEVELS:
        raise ApprovalError(
            "invalid", f"escalation: a list of at most {MAX_LEVELS} levels", field="escalation"
        )
    levels: list[dict[str, Any]] = []
    previous = 0
    for n, level in enumerate(value):
        where = f"escalation[{n}]"
        if (
            not isinstance(level, dict)
            or not set(level) <= {"after_s", "roles", "members"}
            or "after_s" not in level
        ):
            raise ApprovalError("invalid", f'{where}: {{"after_s", "roles", "members"}}', field="escalation")
        after = _int(level["after_s"], f"{where}.after_s", previous + 1, max(previous + 1, ttl_s - 1))
        levels.append(
            {
                "after_s": after,
                "roles": _roles(level.get("roles", []), f"{where}.roles"),
                "members": _members(level.get("members", []), f"{where}.members"),
            }
        )
        previous = after
    return levels


def _policy_fields(data: Mapping[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """Checked policy fields: `data` over `current` (an update) or over the defaults (a creation)."""
    base: dict[str, Any] = current or {
        "tool": "*",
        "semantics": [],
        "predicates": [],
        "required_approvals": 1,
        "eligible_roles": DEFAULT_ROLES,
        "eligible_members": [],
        "passkey_only": False,
        "ttl_s": 3600,
        "execution_window_s": 300,
        "warn_before_s": 300,
        "escalation": [],
        "enabled": True,
    }
    unknown = set(data) - (set(base) | {"name"}) - {"version"}
    if unknown:
        field = sorted(unknown)[0]
        raise ApprovalError("invalid", f"{field}: not a policy field", field=field)
    merged = {**base, **{k: v for k, v in data.items() if k != "version"}}
    name = merged.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX or "\x00" in name:
        raise ApprovalError("invalid_name", f"name: 1 to {NAME_MAX} characters", field="name")
    tool = merged["tool"]
    if not isinstance(tool, str) or not 0 < len(tool) <= 200 or "\x00" in tool:
        raise ApprovalError("invalid_tool", "tool: a glob of 1 to 200 characters", field="tool")
    semantics = merged["semantics"]
    if not isinstance(semantics, list) or not all(s in SEMANTICS for s in semantics):
        raise ApprovalError("invalid", f"semantics: a list of {', '.join(SEMANTICS)}", field="semantics")
    try:
        checked = predicates.validate(merged["predicates"])
    except predicates.InvalidPredicate as exc:
        raise ApprovalError("invalid_predicate", str(exc), field="predicates") from None
    ttl_s = _int(merged["ttl_s"], "ttl_s", 10, MAX_TTL_S)
    fields = {
        "name": name,
        "tool": tool,
        "semantics": sorted(set(semantics)),
        "predicates": checked,
        "required_approvals": _int(merged["required_approvals"], "required_approvals", 1, MAX_APPROVALS),
        "eligible_roles": _roles(merged["eligible_roles"], "eligible_roles"),
        "eligible_members": _members(merged["eligible_members"], "eligible_members"),
        "passkey_only": _bool(merged["passkey_only"], "passkey_only"),
        "ttl_s": ttl_s,
        "execution_window_s": _int(merged["execution_window_s"], "execution_window_s", 1, MAX_WINDOW_S),
        "warn_before_s": _int(merged["warn_before_s"], "warn_before_s", 0, ttl_s),
        "escalation": _escalation(merged["escalation"], ttl_s),
        "enabled": _bool(merged["enabled"], "enabled"),
    }
    if not fields["eligible_roles"] and not fields["eligible_members"]:
        raise ApprovalError(
            "invalid",
            "eligible_roles or eligible_members: someone must be able to approve",
            field="eligible_roles",
        )
    return fields


@contextmanager
def _name_not_taken(name: str) -> Iterator[None]:
    """A savepoint around a policy's write: the unique name is the database's to check, and a
    name taken (even by a write racing this one) is a 409 that spoils nothing else."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError:
        raise ApprovalError(
            "name_taken", f"an approval policy named '{name}' exists", status=409, field="name"
        ) from None


def create_policy(tenant: Tenant, *, actor: str, **data: Any) -> ApprovalPolicy:
    with tenant_context(tenant):
        fields = _policy_fields(data)
        with _name_not_taken(fields["name"]):
            policy = ApprovalPolicy.objects.create(**fields)
        append_server_record(
            tenant,
            "APPROVAL_POLICY_CREATED",
            {"policy": policy.pk, "old": None, "new": policy_values(policy)},
            actor=actor,
        )
        fleet.policies_changed(tenant)
        forget_policies(tenant)
    return policy


def update_policy(tenant: Tenant, policy_id: int, *, actor: str, **data: Any) -> ApprovalPolicy:
    """Change a policy; its version moves on every edit, so a request opened under the old terms
    is never reused for a call under the new ones."""
    with tenant_context(tenant):
        policy = ApprovalPolicy.objects.select_for_update().filter(pk=policy_id).first()
        if policy is None:
            raise ApprovalError("not_found", "no such approval policy", status=404)
        old = policy_values(policy)
        current = {k: v for k, v in old.items() if k not in ("version",)}
        fields = _policy_fields(data, current)
        for key, value in fields.items():
            setattr(policy, key, value)
        policy.version = F("version") + 1
        policy.updated_at = timezone.now()
        with _name_not_taken(fields["name"]):
            policy.save()
        policy.refresh_from_db()
        append_server_record(
            tenant,
            "APPROVAL_POLICY_UPDATED",
            {"policy": policy.pk, "old": old, "new": policy_values(policy)},
            actor=actor,
        )
        fleet.policies_changed(tenant)
        forget_policies(tenant)
    return policy


def delete_policy(tenant: Tenant, policy_id: int, *, actor: str) -> None:
    with tenant_context(tenant):
        policy = ApprovalPolicy.objects.select_for_update().filter(pk=policy_id).first()
        if policy is None:
            raise ApprovalError("not_found", "no such approval policy", status=404)
        old = policy_values(policy)
        policy.delete()
        append_server_record(
            tenant, "APPROVAL_POLICY_DELETED", {"policy": policy_id, "old": old, "new": None}, actor=actor
        )
        fleet.policies_changed(tenant)
        forget_policies(tenant)


def _rules(policy: ApprovalPolicy) -> dict[str, Any]:
    return {
        "required": policy.required_approvals,
        "eligible_roles": list(policy.eligible_roles),
        "eligible_members": list(policy.eligible_members),
        "passkey_only": policy.passkey_only,
        "ttl_s": policy.ttl_s,
        "execution_window_s": policy.execution_window_s,
        "warn_before_s": policy.warn_before_s,
        "escalation": list(policy.escalation),
    }


def matching_policy(policies: Iterable[ApprovalPolicy], request: GateRequest) -> ApprovalPolicy | None:
    """The policy a call must satisfy: of the enabled ones it matches, the one asking the most
    approvals (then the oldest). One request per call: the strictest policy decides it."""
    found = [
        p
        for p in policies
        if p.enabled
        and tool_matches(p.tool, request.tool)
        and (not p.semantics or request.semantics in p.semantics)
        and predicates.matches(p.predicates, request.args)
    ]
    found.sort(key=lambda p: (-p.required_approvals, p.pk))
    return found[0] if found else None


# ------------------------------------------------------------------------------------------ requests


def action_of(tool: str, args: Mapping[str, Any], amount: Any, policy_key: str) -> tuple[dict[str, Any], str]:
    """The canonical action an approval is bound to, and its SHA-256 (hex)."""
    action = {"tool": tool, "arguments": dict(args), "amount": amount, "policy": policy_key}
    return action, hashlib.sha256(canonical(action)).hexdigest()


def request_id_for(tenant: Tenant, saga_id: str, step_id: str, tool: str, action_digest: str) -> str:
    """Deterministic: a retried step finds its request; any other call (other arguments, another
    amount, the policy edited since) gets another."""
    material = [fleet.gate_tag(tenant), saga_id, step_id, tool, action_digest]
    return hashlib.sha256(canonical(material)).hexdigest()[:32]


def _seconds_left(moment: datetime | None, now: datetime | None = None) -> float | None:
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
        "created_at": row.created_at.isoformat(),
        "expires_at": row.expires_at.isoformat(),
        "expires_in": _seconds_left(row.expires_at, now) if row.status == Status.PENDING else None,
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


def _record(tenant: Tenant, event: str, row: ApprovalRequest, fields: dict[str, Any], *, actor: str) -> None:
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


def _announce(
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


def _requester(api_key_prefix: str) -> int | None:
    if not api_key_prefix:
        return None
    return ApiKey.objects.filter(prefix=api_key_prefix).values_list("created_by_id", flat=True).first()


def _open(
    tenant: Tenant,
    request: GateRequest,
    *,
    source: str,
    policy: ApprovalPolicy | None,
    rules: dict[str, Any],
    policy_key: str,
    amount: Any,
    limits: Sequence[str] = (),
    actor: str,
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
                api_key_prefix=request.api_key_prefix,
                requester_user_id=_requester(request.api_key_prefix),
                idempotency_key=request.idempotency_key,
                required=rules["required"],
                created_at=now,
                expires_at=now + timedelta(seconds=rules["ttl_s"]),
            )
    except IntegrityError:
        # The same call racing itself: the first one opened it.
        return ApprovalRequest.objects.get(pk=request_id)
    _record(
        tenant,
        "APPROVAL_REQUESTED",
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
        },
        actor=actor,
    )
    _announce(tenant, row, "created")
    return row


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
        "expires_in": _seconds_left(row.expires_at),
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


# The enabled policies of a tenant, read once and reused while its epoch stands (a policy change
# bumps it; `core.snapshots`, as the gate's own policy snapshot): every gate call asks, and most
# tenants' policies rarely change. Inside a gate decision the epoch is the one it read.
_SNAPSHOTS: SnapshotCache[list[ApprovalPolicy]] = SnapshotCache()


def _enabled_policies(tenant: Tenant) -> list[ApprovalPolicy]:
    return _SNAPSHOTS.get(tenant, lambda: list(ApprovalPolicy.objects.filter(enabled=True).order_by("pk")))


def forget_policies(tenant: Tenant) -> None:
    _SNAPSHOTS.forget(tenant)


class GateStep:
    """The gate's approval step (`fleet.hooks.ApprovalStep`)."""

    actor = "gate"

    def governed_tools(self) -> list[str]:
        return sorted(set(ApprovalPolicy.objects.filter(enabled=True).values_list("tool", flat=True)))

    def before_debit(self, tenant: Tenant, request: GateRequest, *, escalating: bool) -> gate_hooks.Verdict:
        rows: list[ApprovalRequest] = []
        policy = matching_policy(_enabled_policies(tenant), request)
        if policy is not None:
            rows.append(
                _open(
                    tenant,
                    request,
                    source=Source.POLICY,
                    policy=policy,
                    rules=_rules(policy),
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
        row = _open(
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

    def consume(self, tenant: Tenant, requests: Sequence[str], *, authorization_id: str, actor: str) -> bool:
        now = timezone.now()
        for request_id in requests:
            taken = ApprovalRequest.objects.filter(
                pk=request_id, status=Status.APPROVED, execute_by__gt=now
            ).update(status=Status.CONSUMED, consumed_at=now, authorization_id=authorization_id)
            if taken != 1:
                return False
        for row in ApprovalRequest.objects.filter(pk__in=list(requests)):
            _record(tenant, "APPROVAL_CONSUMED", row, {"authorization_id": authorization_id}, actor=actor)
            _announce(tenant, row, "consumed", {"authorization_id": authorization_id})
        return True


# --------------------------------------------------------------------------------------------- votes


def _voter(member: Membership) -> str:
    return user_actor(member.user.get_username())


def eligible(row: ApprovalRequest, member: Membership) -> bool:
    """May this member's vote count? The policy's group, widened by each escalation level reached;
    always someone whose role may approve, and never the requester (the asking key's owner)."""
    if not member.can("approve") or row.requester_user_id == member.user_id:
        return False
    roles = set(row.rules.get("eligible_roles", []))
    members = set(row.rules.get("eligible_members", []))
    for level in row.rules.get("escalation", [])[: row.escalation_level]:
        roles |= set(level.get("roles", []))
        members |= set(level.get("members", []))
    return member.role in roles or member.user_id in members


def _check_voter(row: ApprovalRequest, member: Membership, *, break_glass: bool) -> None:
    if row.requester_user_id is not None and row.requester_user_id == member.user_id:
        raise ApprovalError(
            "requester_cannot_vote", "the requester (the asking key's owner) cannot vote", status=403
        )
    if break_glass:
        if not member.can("break_glass"):
            raise ApprovalError(
                "break_glass_forbidden", f"the role '{member.role}' may not break glass", status=403
            )
        return
    if not eligible(row, member):
        raise ApprovalError("not_eligible", "this member is not among the request's approvers", status=403)


def _check_open(row: ApprovalRequest, now: datetime) -> None:
    if row.status != Status.PENDING:
        raise ApprovalError("already_decided", f"the request is {row.status}", status=409)
    if row.expires_at <= now:
        raise ApprovalError("expired", "the request expired without a decision", status=409)


def _text(value: Any, field: str, *, limit: int = NOTE_MAX) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise ApprovalError("invalid", f"{field}: a string of at most {limit} characters", field=field)
    return value


def _member_here(tenant: Tenant, member: Membership) -> Membership:
    """The member as they stand now in this tenant (removed since, or of another tenant: refused)."""
    current = Membership.objects.select_related("user").filter(pk=member.pk, user_id=member.user_id).first()
    if current is None or member.tenant_id != tenant.pk:
        raise ApprovalError("not_a_member", "the voter is not a member of this tenant", status=403)
    return current


def challenge_for(action_digest: str, nonce: bytes) -> str:
    """The WebAuthn challenge of a passkey vote: SHA-256(action digest ‖ server nonce), hex."""
    return hashlib.sha256(bytes.fromhex(action_digest) + nonce).hexdigest()


def issue_vote_challenge(
    tenant: Tenant, request_id: str, member: Membership, *, actor: str, break_glass: bool = False
) -> dict[str, Any]:
    """A single-use challenge for this member's passkey vote on this request (valid 5 minutes).
    The authenticator signs `challenge` (32 bytes, hex here); `vote(..., assertion=...)` consumes
    it. The passkeys app verifies the WebAuthn assertion against these bytes."""
    now = timezone.now()
    with tenant_context(tenant):
        row = ApprovalRequest.objects.filter(pk=request_id).first()
        if row is None:
            raise ApprovalError("not_found", "no such approval request", status=404)
        current = _member_here(tenant, member)
        _check_open(row, now)
        _check_voter(row, current, break_glass=break_glass)
        nonce = secrets.token_bytes(32)
        challenge = challenge_for(row.action_digest, nonce)
        VoteChallenge.objects.create(
            request=row,
            user=current.user,
            nonce=nonce.hex(),
            challenge=challenge,
            expires_at=now + CHALLENGE_TTL,
        )
    return {
        "approval_id": row.pk,
        "challenge": challenge,
        "nonce": nonce.hex(),
        "action_digest": row.action_digest,
        "action": row.action,
        "expires_at": (now + CHALLENGE_TTL).isoformat(),
    }


def _take_challenge(
    row: ApprovalRequest, member: Membership, assertion: Any, now: datetime
) -> dict[str, Any]:
    """Consume the member's open challenge the (verified) assertion answers; the assertion is kept
    with the challenge and its nonce, so the vote can be verified again offline."""
    if not isinstance(assertion, dict) or not isinstance(assertion.get("challenge"), str):
        raise ApprovalError(
            "invalid_assertion", "the assertion must name its challenge", status=400, field="assertion"
        )
    if len(json.dumps(assertion, default=str)) > ASSERTION_MAX_BYTES:
        raise ApprovalError("invalid_assertion", "the assertion is too large", status=400, field="assertion")
    issued = VoteChallenge.objects.filter(
        request=row,
        user_id=member.user_id,
        challenge=assertion["challenge"].lower(),
        used_at__isnull=True,
        expires_at__gt=now,
    ).first()
    if issued is None or not VoteChallenge.objects.filter(pk=issued.pk, used_at__isnull=True).update(
        used_at=now
    ):
        raise ApprovalError(
            "challenge_invalid",
            "the assertion answers no open challenge of this member for this request",
            status=403,
        )
    kept: dict[str, Any] = json.loads(json.dumps(assertion, default=str))
    kept.update(challenge=issued.challenge, nonce=issued.nonce)
    return kept


def vote(
    tenant: Tenant,
    request_id: str,
    member: Membership,
    choice: Any,
    note: Any = "",
    *,
    actor: str,
    assertion: dict[str, Any] | None = None,
    break_glass: bool = False,
) -> ApprovalRequest:
    """One member's vote. The first vote of a member counts (a second is refused); an eligible
    deny denies; `required` approvals approve; break-glass (owners only, with a written reason)
    approves at once and is recorded as such. A passkey-only policy needs `assertion`: a WebAuthn
    assertion the passkeys app has verified against a challenge from `issue_vote_challenge`.
    Racing votes are serialised on the request's row: it is decided once."""
    now = timezone.now()
    with tenant_context(tenant):
        current = _member_here(tenant, member)
        row = ApprovalRequest.objects.select_for_update().filter(pk=request_id).first()
        if row is None:
            raise ApprovalError("not_found", "no such approval request", status=404)
        if choice not in VoteChoice.values:
            raise ApprovalError("invalid", "choice: approve or deny", field="choice")
        note = _text(note, "note")
        if break_glass and (choice != VoteChoice.APPROVE or not note.strip()):
            raise ApprovalError(
                "reason_required", "break-glass approves, with a written reason", field="note"
            )
        _check_open(row, now)
        _check_voter(row, current, break_glass=break_glass)
        kept: dict[str, Any] | None = None
        if assertion is not None:
            kept = _take_challenge(row, current, assertion, now)
        elif row.rules.get("passkey_only"):
            raise ApprovalError("passkey_required", "this policy takes passkey votes only", status=403)
        voter = _voter(current)
        try:
            with transaction.atomic():
                Vote.objects.create(
                    request=row,
                    user=current.user,
                    voter=voter,
                    role=current.role,
                    choice=choice,
                    note=note,
                    break_glass=break_glass,
                    assertion=kept,
                    created_at=now,
                )
        except IntegrityError:
            raise ApprovalError(
                "already_voted", "this member has voted on this request", status=409
            ) from None
        _record(
            tenant,
            "APPROVAL_BREAK_GLASS" if break_glass else "APPROVAL_VOTE",
            row,
            {
                "voter": voter,
                "role": current.role,
                "choice": choice,
                "note": note,
                "assertion": kept,
                "requires_review": break_glass,
            },
            actor=actor,
        )
        _announce(tenant, row, "voted", {"voter": voter, "choice": choice, "break_glass": break_glass})
        if choice == VoteChoice.DENY:
            _decide(tenant, row, Status.DENIED, now, by=voter, note=note, actor=actor)
        else:
            row.approvals += 1
            row.save(update_fields=["approvals"])
            if break_glass or row.approvals >= row.required:
                row.break_glass = break_glass
                row.execute_by = now + timedelta(seconds=int(row.rules.get("execution_window_s", 300)))
                _decide(tenant, row, Status.APPROVED, now, by=voter, note=note, actor=actor)
    return row


def _decide(
    tenant: Tenant, row: ApprovalRequest, status: str, now: datetime, *, by: str, note: str, actor: str
) -> None:
    row.status, row.decided_at, row.decided_by, row.note = status, now, by, note
    row.save(update_fields=["status", "decided_at", "decided_by", "note", "break_glass", "execute_by"])
    event = {Status.APPROVED.value: "APPROVAL_GRANTED", Status.DENIED.value: "APPROVAL_DENIED"}.get(
        status, "APPROVAL_EXPIRED"
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
    _record(tenant, event, row, fields, actor=actor)
    _announce(tenant, row, "decided")


# ------------------------------------------------------------------------------------- the sweep


SWEEP_BATCH = 500


def sweep(tenant: Tenant, *, now: datetime | None = None, actor: str = "approvals-sweep") -> dict[str, int]:
    """Deadlines, warnings and escalation for one tenant (the beat runs it every few seconds):
    an open request past its deadline is expired (denied); one within `warn_before_s` of it is
    warned once; escalation levels whose delay has passed are reached in order; an approval not
    used in its execution window lapses. Every transition is a conditional UPDATE, so a vote or a
    gate call racing the sweep wins or loses whole."""
    now = now or timezone.now()
    done = {"expired": 0, "warned": 0, "escalated": 0, "lapsed": 0}
    with tenant_context(tenant):
        for row in ApprovalRequest.objects.filter(status=Status.PENDING, expires_at__lte=now)[:SWEEP_BATCH]:
            if ApprovalRequest.objects.filter(pk=row.pk, status=Status.PENDING).update(
                status=Status.EXPIRED,
                decided_at=now,
                decided_by="deadline",
                note="expired without a decision",
            ):
                row.refresh_from_db()
                _record(
                    tenant,
                    "APPROVAL_EXPIRED",
                    row,
                    {"approvals": row.approvals, "required": row.required},
                    actor=actor,
                )
                _announce(tenant, row, "decided")
                done["expired"] += 1
        for row in ApprovalRequest.objects.filter(status=Status.APPROVED, execute_by__lte=now)[:SWEEP_BATCH]:
            if ApprovalRequest.objects.filter(pk=row.pk, status=Status.APPROVED, execute_by__lte=now).update(
                status=Status.LAPSED
            ):
                row.refresh_from_db()
                _record(
                    tenant,
                    "APPROVAL_LAPSED",
                    row,
                    {"execute_by": row.execute_by.isoformat() if row.execute_by else None},
                    actor=actor,
                )
                _announce(tenant, row, "decided")
                done["lapsed"] += 1
        for row in ApprovalRequest.objects.filter(status=Status.PENDING, expires_at__gt=now).order_by(
            "expires_at"
        )[:SWEEP_BATCH]:
            elapsed = (now - row.created_at).total_seconds()
            levels = row.rules.get("escalation", [])
            reached = sum(1 for level in levels if elapsed >= level.get("after_s", 0))
            if reached > row.escalation_level and ApprovalRequest.objects.filter(
                pk=row.pk, status=Status.PENDING, escalation_level=row.escalation_level
            ).update(escalation_level=reached):
                level = levels[reached - 1]
                row.escalation_level = reached
                notify = {
                    "level": reached,
                    "roles": level.get("roles", []),
                    "members": level.get("members", []),
                }
                _record(tenant, "APPROVAL_ESCALATED", row, notify, actor=actor)
                _announce(tenant, row, "escalated", notify)
                done["escalated"] += 1
            warn_at = row.expires_at - timedelta(seconds=int(row.rules.get("warn_before_s", 0)))
            if (
                row.warned_at is None
                and warn_at <= now
                and ApprovalRequest.objects.filter(
                    pk=row.pk, status=Status.PENDING, warned_at__isnull=True
                ).update(warned_at=now)
            ):
                row.warned_at = now
                detail = {
                    "expires_at": row.expires_at.isoformat(),
                    "expires_in": _seconds_left(row.expires_at, now),
                    "approvals": row.approvals,
                    "required": row.required,
                }
                _record(tenant, "APPROVAL_WARNING", row, detail, actor=actor)
                _announce(tenant, row, "warned", detail)
                done["warned"] += 1
    return done


# ------------------------------------------------------------------------------------- reading


def requests(status: str | None = None, *, limit: int = 100) -> list[ApprovalRequest]:
    """The active tenant's requests, newest first (optionally of one status)."""
    rows = ApprovalRequest.objects.order_by("-created_at", "pk")
    if status:
        rows = rows.filter(status=status)
    return list(rows[:limit])


def break_glass_uses(limit: int = 200) -> list[dict[str, Any]]:
    """Every break-glass approval, newest first, for review."""
    votes = Vote.objects.filter(break_glass=True).select_related("request").order_by("-created_at")[:limit]
    return [
        {
            **vote_values(v),
            "approval_id": v.request_id,
            "saga_id": v.request.saga_id,
            "tool": v.request.tool,
            "action_digest": v.request.action_digest,
        }
        for v in votes
    ]
