"""Circuit breakers: create, change and delete (each recorded with old and new values, in one
transaction). Their states move in `fleet.actions.breaker_states`."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane.events import Event

from audit.services import append_server_record
from fleet.actions.changes import (
    FleetError,
    changed_after_commit,
    check_name_and_tool,
    check_whole,
    create_policy,
    delete_policy,
)
from fleet.inputs import MAX_WINDOW_S
from fleet.models import CircuitBreaker
from tenants.models import Tenant
from tenants.scoping import tenant_context

FIELDS = ("name", "tool", "consecutive_failures", "failure_rate", "min_volume", "window_s", "cool_down_s")
# Changing one of these starts the breaker's counts afresh (a new generation).
THRESHOLDS = frozenset(FIELDS) - {"name"}
MAX_CONSECUTIVE = 10**6
MAX_VOLUME = 10**9


def breaker_values(breaker: CircuitBreaker) -> dict[str, Any]:
    """A breaker's settings as audit records and the API show them."""
    return {
        "name": breaker.name,
        "tool": breaker.tool,
        "consecutive_failures": breaker.consecutive_failures,
        "failure_rate": float(breaker.failure_rate),
        "min_volume": breaker.min_volume,
        "window_s": breaker.window_s,
        "cool_down_s": breaker.cool_down_s,
    }


def _rate(value: Any) -> Decimal:
    """A failure rate: a JSON number above 0 and at most 1, with at most 4 decimals (stored exactly)."""
    message = "failure_rate must be a number above 0 and at most 1, with at most 4 decimals"
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise FleetError("invalid_failure_rate", "failure_rate", message)
    try:
        rate = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, ValueError):
        raise FleetError("invalid_failure_rate", "failure_rate", message) from None
    exponent = rate.as_tuple().exponent
    if not rate.is_finite() or not 0 < rate <= 1 or (isinstance(exponent, int) and exponent < -4):
        raise FleetError("invalid_failure_rate", "failure_rate", message)
    return rate


def checked(fields: dict[str, Any], *, partial: bool) -> dict[str, Any]:
    """The fields as stored, each checked; an unknown field, or (unless `partial`) a missing one,
    is refused by name."""
    for name in fields:
        if name not in FIELDS:
            raise FleetError("unknown_field", name, f"{name}: not a field of a breaker ({', '.join(FIELDS)})")
    if not partial:
        for name in FIELDS:
            if name not in fields:
                raise FleetError("invalid", name, f"{name}: required")
    out = dict(fields)
    if "name" in fields or "tool" in fields:
        check_name_and_tool(fields.get("name", "x"), fields.get("tool", "x"))
    if "consecutive_failures" in fields:
        check_whole(
            fields["consecutive_failures"],
            "consecutive_failures",
            "invalid_consecutive_failures",
            1,
            MAX_CONSECUTIVE,
        )
    if "failure_rate" in fields:
        out["failure_rate"] = _rate(fields["failure_rate"])
    if "min_volume" in fields:
        check_whole(fields["min_volume"], "min_volume", "invalid_min_volume", 1, MAX_VOLUME)
    if "window_s" in fields:
        check_whole(fields["window_s"], "window_s", "invalid_window", 1, MAX_WINDOW_S)
    if "cool_down_s" in fields:
        check_whole(fields["cool_down_s"], "cool_down_s", "invalid_cool_down", 1, MAX_WINDOW_S)
    return out


def create_breaker(tenant: Tenant, *, actor: str, fields: dict[str, Any]) -> CircuitBreaker:
    """A closed breaker for the tools matching `tool` (every field in `FIELDS` required)."""
    return create_policy(
        tenant,
        CircuitBreaker,
        checked(fields, partial=False),
        actor=actor,
        event=Event.FLEET_BREAKER_CREATED,
        subject="breaker",
        values=breaker_values,
    )


def update_breaker(tenant: Tenant, breaker_id: int, *, actor: str, fields: dict[str, Any]) -> CircuitBreaker:
    """Change some settings; a change of the tool or a threshold starts its counts afresh (its
    state stays). Nothing changed: nothing recorded."""
    changes = checked(fields, partial=True)
    with tenant_context(tenant):
        breaker = CircuitBreaker.objects.select_for_update().filter(pk=breaker_id).first()
        if breaker is None:
            raise FleetError("not_found", "id", "no such breaker", status=404)
        old = breaker_values(breaker)
        for name, value in changes.items():
            setattr(breaker, name, value)
        new = breaker_values(breaker)
        if new == old:
            return breaker
        if any(old[name] != new[name] for name in THRESHOLDS):
            breaker.generation += 1
        breaker.updated_at = timezone.now()
        try:
            with transaction.atomic():  # a savepoint: the refused UPDATE must not spoil the rest
                breaker.save()
        except IntegrityError:
            raise FleetError(
                "name_taken", "name", f"a breaker named '{breaker.name}' exists", status=409
            ) from None
        append_server_record(
            tenant, Event.FLEET_BREAKER_UPDATED, {"breaker": breaker.pk, "old": old, "new": new}, actor=actor
        )
        changed_after_commit(tenant)
    return breaker


def delete_breaker(tenant: Tenant, breaker_id: int, *, actor: str) -> None:
    delete_policy(
        tenant,
        CircuitBreaker,
        breaker_id,
        actor=actor,
        event=Event.FLEET_BREAKER_DELETED,
        subject="breaker",
        values=breaker_values,
    )
