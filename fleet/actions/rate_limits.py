"""Rate limits: create and delete (each recorded with old and new values, in one transaction)."""

from __future__ import annotations

from typing import Any

from sagaplane.events import Event

from fleet.actions.changes import FleetError, check_common, create_policy, delete_policy
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


def create_rate_limit(
    tenant: Tenant, *, actor: str, name: Any, max_calls: Any, window_s: Any, tool: Any = "*", per: Any = None
) -> RateLimit:
    per = [] if per is None else per
    check_common(name, tool, window_s, per)
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or not 1 <= max_calls <= 10**9:
        raise FleetError("invalid_max_calls", "max_calls", "max_calls must be a whole number from 1 to 10^9")
    return create_policy(
        tenant,
        RateLimit,
        {"name": name, "tool": tool, "max_calls": max_calls, "window_s": window_s, "per": per},
        actor=actor,
        event=Event.FLEET_RATE_LIMIT_CREATED,
        subject="rate_limit",
        values=rate_limit_values,
    )


def delete_rate_limit(tenant: Tenant, rate_limit_id: int, *, actor: str) -> None:
    delete_policy(
        tenant,
        RateLimit,
        rate_limit_id,
        actor=actor,
        event=Event.FLEET_RATE_LIMIT_DELETED,
        subject="rate_limit",
        values=rate_limit_values,
    )
