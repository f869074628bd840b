"""Rate limits: create, change and delete (each recorded with old and new values, in one transaction)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sagaplane.events import Event

from core.actors import Actor
from fleet.actions.changes import create_policy, delete_policy, update_policy
from fleet.inputs import NewRateLimit
from fleet.models import RateLimit
from tenants.models import Tenant


def rate_limit_values(limit: RateLimit) -> dict[str, Any]:
    """A rate limit as audit records and the API show it."""
    return {
        "name": limit.name,
        "tool": limit.tool,
        "max_calls": limit.max_calls,
        "window_s": limit.window_s,
        "per": list(limit.per),
    }


def _fields(rate_limit: NewRateLimit) -> dict[str, Any]:
    """The command's terms as the model's columns (they share their names; `per` is stored as a list)."""
    return {**asdict(rate_limit), "per": list(rate_limit.per)}


def create_rate_limit(tenant: Tenant, rate_limit: NewRateLimit, *, actor: Actor) -> RateLimit:
    """Create a rate limit (checked by `fleet.inputs.RateLimitCreate`) and record it."""
    return create_policy(
        tenant,
        RateLimit,
        _fields(rate_limit),
        actor=actor,
        event=Event.FLEET_RATE_LIMIT_CREATED,
        subject="rate_limit",
        values=rate_limit_values,
    )


def update_rate_limit(
    tenant: Tenant, rate_limit_id: int, rate_limit: NewRateLimit, *, actor: Actor
) -> RateLimit:
    """Set a rate limit's terms (checked by `fleet.inputs.RateLimitCreate`; its name stays) and
    record the change. A new window counts afresh (the counters are per window)."""
    return update_policy(
        tenant,
        RateLimit,
        rate_limit_id,
        _fields(rate_limit),
        actor=actor,
        event=Event.FLEET_RATE_LIMIT_UPDATED,
        subject="rate_limit",
        values=rate_limit_values,
    )


def delete_rate_limit(tenant: Tenant, rate_limit_id: int, *, actor: Actor) -> None:
    delete_policy(
        tenant,
        RateLimit,
        rate_limit_id,
        actor=actor,
        event=Event.FLEET_RATE_LIMIT_DELETED,
        subject="rate_limit",
        values=rate_limit_values,
    )
