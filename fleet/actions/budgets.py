"""Budgets: create and delete (each recorded with old and new values, in one transaction)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sagaplane.events import Event

from fleet import gate
from fleet.actions.changes import FleetError, check_common, create_policy, delete_policy
from fleet.models import BudgetLimit, OnCap
from tenants.models import Tenant


def budget_values(limit: BudgetLimit) -> dict[str, Any]:
    """A budget as audit records and the API show it."""
    return {
        "name": limit.name,
        "tool": limit.tool,
        "argument": limit.argument,
        "max_total": gate.from_units(gate.to_units(limit.max_total)),
        "window_s": limit.window_s,
        "per": list(limit.per),
        "on_cap": limit.on_cap,
    }


def create_budget(
    tenant: Tenant,
    *,
    actor: str,
    name: Any,
    max_total: Any,
    window_s: Any,
    tool: Any = "*",
    argument: Any = "amount",
    per: Any = None,
    on_cap: Any = OnCap.DENY,
) -> BudgetLimit:
    per = [] if per is None else per
    check_common(name, tool, window_s, per)
    if not isinstance(argument, str) or not argument or len(argument) > 100:
        raise FleetError("invalid_argument_name", "argument", "argument must name the numeric argument")
    try:
        cap_units = gate.to_units(max_total if not isinstance(max_total, str) else Decimal(max_total))
    except (ValueError, ArithmeticError):
        raise FleetError("invalid_max_total", "max_total", "max_total must be a positive number") from None
    if cap_units <= 0:
        raise FleetError("invalid_max_total", "max_total", "max_total must be a positive number")
    if on_cap not in OnCap.values:
        raise FleetError("invalid_on_cap", "on_cap", f"on_cap must be one of {', '.join(OnCap.values)}")
    return create_policy(
        tenant,
        BudgetLimit,
        {
            "name": name,
            "tool": tool,
            "argument": argument,
            "max_total": Decimal(cap_units) / gate.SCALE,
            "window_s": window_s,
            "per": per,
            "on_cap": on_cap,
        },
        actor=actor,
        event=Event.FLEET_BUDGET_CREATED,
        subject="budget",
        values=budget_values,
    )


def delete_budget(tenant: Tenant, budget_id: int, *, actor: str) -> None:
    delete_policy(
        tenant,
        BudgetLimit,
        budget_id,
        actor=actor,
        event=Event.FLEET_BUDGET_DELETED,
        subject="budget",
        values=budget_values,
    )
