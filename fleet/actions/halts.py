"""Kill switches: put in force (`halt`) and lifted (`resume`), each recorded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor, stored
from core.errors import DomainError
from core.scoping import require_tenant
from fleet.actions.changes import changed_after_commit
from fleet.inputs import NewHalt
from fleet.models import Halt
from tenants.models import Tenant


def halt_values(halt: Halt) -> dict[str, Any]:
    """A halt as audit records and the API show it."""
    return {
        "scope": halt.scope,
        "mode": halt.mode,
        "reason": halt.reason,
        "expires_at": halt.expires_at.isoformat() if halt.expires_at else None,
    }


def halt(tenant: Tenant, command: NewHalt, *, actor: Actor) -> Halt:
    """Put a kill switch in force (checked by `fleet.inputs.HaltCreate`; optional TTL)."""
    ttl_s = command.ttl_s
    now = timezone.now()
    require_tenant(tenant)
    with transaction.atomic():
        row = Halt.objects.create(
            scope=command.scope,
            mode=command.mode,
            reason=command.reason,
            actor=stored(actor),
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


def resume(tenant: Tenant, halt_id: int, *, actor: Actor) -> Halt | None:
    """Lift a halt; None when it was already lifted or had expired (a no-op records nothing)."""
    require_tenant(tenant)
    with transaction.atomic():
        row = Halt.objects.select_for_update().filter(pk=halt_id).first()
        if row is None:
            raise DomainError("not_found", "no such halt", status=404, field="id")
        now = timezone.now()
        if row.lifted_at is not None or (row.expires_at is not None and row.expires_at <= now):
            return None
        row.lifted_at, row.lifted_by = now, stored(actor)
        row.save(update_fields=["lifted_at", "lifted_by"])
        append_server_record(
            tenant,
            Event.KILLSWITCH_RELEASED,
            {"halt": row.pk, "old": {"in_force": True}, "new": {"in_force": False}, "scope": row.scope},
            actor=actor,
        )
        changed_after_commit(tenant)
    return row
