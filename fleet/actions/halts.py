"""Kill switches: put in force (`halt`) and lifted (`resume`), each recorded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from sagaplane.events import Event

from audit.services import append_server_record
from fleet import gate
from fleet.actions.changes import FleetError, changed_after_commit
from fleet.models import Halt, HaltMode
from tenants.models import Tenant
from tenants.scoping import tenant_context

MAX_TTL_S = 366 * 24 * 3600
# The cap of a budget an approved escalation lifts, for one call: above any window's possible sum


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
            tenant,
            Event.KILLSWITCH_ENGAGED,
            {"halt": row.pk, "old": None, "new": halt_values(row)},
            actor=actor,
        )
        changed_after_commit(tenant)
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
            Event.KILLSWITCH_RELEASED,
            {"halt": row.pk, "old": {"in_force": True}, "new": {"in_force": False}, "scope": row.scope},
            actor=actor,
        )
        changed_after_commit(tenant)
    return row
