"""Rate limits: create and delete (each recorded with old and new values, in one transaction)."""

from __future__ import annotations

from typing import Any

from sagaplane.events import Event

from core.actors import Actor
from fleet.actions.changes import create_policy, delete_policy
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


def create_rate_limit(tenant: Tenant, rate_limit: NewRateLimit, *, actor: Actor) -> RateLimit:
    """Create a rate limit (checked by `fleet.inputs.RateLimitCreate`) and record it."""
    return create_policy(
        tenant,
        RateLimit,
        {
            "name": rate_limit.name,
            "tool": rate_limit.tool,
            "max_calls": rate_limit.max_calls,
            "window_s": rate_limit.window_s,
            "per": list(rate_limit.per),
        },
        actor=actor,
        event=Event.FLEET_RATE_LIMIT_CREATED,
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
