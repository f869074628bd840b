"""Circuit breakers: create, change and delete (each recorded with old and new values, in one
transaction; their inputs are `fleet.inputs.BreakerCreate` and `BreakerUpdate`). Their states move
in `fleet.actions.breaker_states`."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor
from core.errors import DomainError
from core.scoping import require_tenant
from fleet.actions.changes import changed_after_commit, create_policy, delete_policy
from fleet.inputs import BreakerChange, NewBreaker
from fleet.models import CircuitBreaker
from tenants.models import Tenant

FIELDS = ("name", "tool", "consecutive_failures", "failure_rate", "min_volume", "window_s", "cool_down_s")
# Changing one of these starts the breaker's counts afresh (a new generation).
THRESHOLDS = frozenset(FIELDS) - {"name"}


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


def create_breaker(tenant: Tenant, breaker: NewBreaker, *, actor: Actor) -> CircuitBreaker:
    """A closed breaker for the tools matching `tool` (checked by `fleet.inputs.BreakerCreate`)."""
    return create_policy(
        tenant,
        CircuitBreaker,
        {name: getattr(breaker, name) for name in FIELDS},
        actor=actor,
        event=Event.FLEET_BREAKER_CREATED,
        subject="breaker",
        values=breaker_values,
    )


def update_breaker(tenant: Tenant, breaker_id: int, change: BreakerChange, *, actor: Actor) -> CircuitBreaker:
    """Change the settings `change` names (checked by `fleet.inputs.BreakerUpdate`); a change of
    the tool or a threshold starts its counts afresh (its state stays). Nothing changed: nothing
    recorded."""
    changes = {name: getattr(change, name) for name in FIELDS if getattr(change, name) is not None}
    require_tenant(tenant)
    with transaction.atomic():
        breaker = CircuitBreaker.objects.select_for_update().filter(pk=breaker_id).first()
        if breaker is None:
            raise DomainError("not_found", "no such breaker", status=404, field="id")
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
            taken = f"a breaker named '{breaker.name}' exists"
            raise DomainError("name_taken", taken, status=409, field="name") from None
        append_server_record(
            tenant, Event.FLEET_BREAKER_UPDATED, {"breaker": breaker.pk, "old": old, "new": new}, actor=actor
        )
        changed_after_commit(tenant)
    return breaker


def delete_breaker(tenant: Tenant, breaker_id: int, *, actor: Actor) -> None:
    delete_policy(
        tenant,
        CircuitBreaker,
        breaker_id,
        actor=actor,
        event=Event.FLEET_BREAKER_DELETED,
        subject="breaker",
        values=breaker_values,
    )
