"""Approval policies: which calls need whose approval, how many, for how long.

Each change takes a keyword-only `actor` and appends its record (old and new values) to the
tenant's server stream in the same transaction; the policy's version moves on every edit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from sagaplane.events import Event

from approvals import predicates
from approvals.actions.snapshot import forget_policies
from approvals.inputs import NAME_MAX, PolicyTerms
from approvals.models import ApprovalPolicy, PolicyVersion
from core.actionaudit import append_server_record
from core.actors import Actor, stored
from core.errors import DomainError
from core.scoping import require_tenant
from fleet import services as fleet
from fleet.gate import GateRequest, tool_matches
from tenants.models import Membership, Role, Tenant

MAX_LEVELS = 5
DEFAULT_ROLES = [Role.APPROVER.value, Role.ADMIN.value, Role.OWNER.value]


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
        raise DomainError("invalid", f"{field}: a whole number from {low} to {high}", field=field)
    return value


def _roles(value: Any, field: str) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(r, str) and r in Role.values for r in value):
        raise DomainError("invalid", f"{field}: a list of roles ({', '.join(Role.values)})", field=field)
    return sorted(set(value))


def _members(value: Any, field: str) -> list[int]:
    """Named members: user ids or e-mail addresses of the active tenant's members."""
    if not isinstance(value, list) or len(value) > 100:
        raise DomainError("invalid", f"{field}: a list of at most 100 members", field=field)
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
            raise DomainError("unknown_member", f"{field}: {item!r} is not a member", field=field)
        ids.add(found)
    return sorted(ids)


def _escalation(value: Any, ttl_s: int) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_LEVELS:
        raise DomainError("invalid", f"escalation: a list of at most {MAX_LEVELS} levels", field="escalation")
    levels: list[dict[str, Any]] = []
    previous = 0
    for n, level in enumerate(value):
        where = f"escalation[{n}]"
        if (
            not isinstance(level, dict)
            or not set(level) <= {"after_s", "roles", "members"}
            or "after_s" not in level
        ):
            raise DomainError("invalid", f'{where}: {{"after_s", "roles", "members"}}', field="escalation")
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


_DEFAULTS: dict[str, Any] = {
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


def _policy_fields(terms: PolicyTerms, current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The policy's fields: the terms given (each checked by `approvals.inputs.PolicyChange`) over
    `current` (a change) or the defaults (a creation), then what depends on another term or on
    the tenant's members."""
    merged = {**(current or _DEFAULTS), **terms.given()}
    name = merged.get("name")
    if not isinstance(name, str):
        raise DomainError("invalid_name", f"name: 1 to {NAME_MAX} characters", field="name")
    ttl_s = merged["ttl_s"]
    fields = {
        "name": name,
        "tool": merged["tool"],
        "semantics": sorted(set(merged["semantics"])),
        "predicates": list(merged["predicates"]),
        "required_approvals": merged["required_approvals"],
        "eligible_roles": sorted(set(merged["eligible_roles"])),
        "eligible_members": _members(merged["eligible_members"], "eligible_members"),
        "passkey_only": merged["passkey_only"],
        "ttl_s": ttl_s,
        "execution_window_s": merged["execution_window_s"],
        "warn_before_s": _int(merged["warn_before_s"], "warn_before_s", 0, ttl_s),
        "escalation": _escalation(merged["escalation"], ttl_s),
        "enabled": merged["enabled"],
    }
    if not fields["eligible_roles"] and not fields["eligible_members"]:
        raise DomainError(
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
        raise DomainError(
            "name_taken", f"an approval policy named '{name}' exists", status=409, field="name"
        ) from None


def create_policy(tenant: Tenant, terms: PolicyTerms, *, actor: Actor) -> ApprovalPolicy:
    """A new policy (`terms` from `approvals.inputs.PolicyCreate`), recorded."""
    require_tenant(tenant)
    with transaction.atomic():
        fields = _policy_fields(terms)
        with _name_not_taken(fields["name"]):
            policy = ApprovalPolicy.objects.create(**fields)
        _changed(tenant, Event.APPROVAL_POLICY_CREATED, policy.pk, None, policy_values(policy), actor=actor)
        _keep_version(policy, actor)
    return policy


def update_policy(tenant: Tenant, policy_id: int, terms: PolicyTerms, *, actor: Actor) -> ApprovalPolicy:
    """Change a policy; its version moves on every edit, so a request opened under the old terms
    is never reused for a call under the new ones."""
    require_tenant(tenant)
    with transaction.atomic():
        policy = ApprovalPolicy.objects.select_for_update().filter(pk=policy_id).first()
        if policy is None:
            raise DomainError("not_found", "no such approval policy", status=404)
        old = policy_values(policy)
        current = {k: v for k, v in old.items() if k not in ("version",)}
        fields = _policy_fields(terms, current)
        for key, value in fields.items():
            setattr(policy, key, value)
        policy.version = F("version") + 1
        policy.updated_at = timezone.now()
        with _name_not_taken(fields["name"]):
            policy.save()
        policy.refresh_from_db()
        _changed(tenant, Event.APPROVAL_POLICY_UPDATED, policy.pk, old, policy_values(policy), actor=actor)
        _keep_version(policy, actor)
    return policy


def delete_policy(tenant: Tenant, policy_id: int, *, actor: Actor) -> None:
    require_tenant(tenant)
    with transaction.atomic():
        policy = ApprovalPolicy.objects.select_for_update().filter(pk=policy_id).first()
        if policy is None:
            raise DomainError("not_found", "no such approval policy", status=404)
        old = policy_values(policy)
        policy.delete()
        _changed(tenant, Event.APPROVAL_POLICY_DELETED, policy_id, old, None, actor=actor)


def _changed(tenant: Tenant, event: Event, policy_id: int, old: Any, new: Any, *, actor: Actor) -> None:
    """A policy changed: its audit record (old and new values) in the caller's transaction, and
    every process' snapshot of the tenant's policies (the gate's and this app's) let go."""
    append_server_record(tenant, event, {"policy": policy_id, "old": old, "new": new}, actor=actor)
    fleet.policies_changed(tenant)
    forget_policies(tenant)


def _keep_version(policy: ApprovalPolicy, actor: Actor) -> None:
    """The version just written, kept for the policy's history (in the change's transaction)."""
    PolicyVersion.objects.create(
        policy_pk=policy.pk,
        version=policy.version,
        terms=policy_values(policy),
        actor=stored(actor),
        created_at=policy.updated_at,
    )


def rules_of(policy: ApprovalPolicy) -> dict[str, Any]:
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
        and call_matches(p.tool, p.semantics, p.predicates, request.tool, request.semantics, request.args)
    ]
    found.sort(key=lambda p: (-p.required_approvals, p.pk))
    return found[0] if found else None


def call_matches(
    tool_glob: str,
    semantics: list[str],
    conditions: list[dict[str, Any]],
    tool: str,
    call_semantics: str,
    args: Any,
) -> bool:
    """A call (its tool, semantics and arguments) is one the terms govern: the gate's test, and the
    rule builder's preview against past calls."""
    return (
        tool_matches(tool_glob, tool)
        and (not semantics or call_semantics in semantics)
        and predicates.matches(conditions, args)
    )
