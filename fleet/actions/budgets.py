"""Budgets: create, change and delete (each recorded with old and new values, in one transaction)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sagaplane.events import Event

from core.actors import Actor
from fleet import gate
from fleet.actions.changes import create_policy, delete_policy, update_policy
from fleet.inputs import NewBudget
from fleet.models import BudgetLimit
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


def _fields(budget: NewBudget) -> dict[str, Any]:
    """The command's terms as the model's columns (they share their names; `per` is stored as a list)."""
    return {**asdict(budget), "per": list(budget.per)}


def create_budget(tenant: Tenant, budget: NewBudget, *, actor: Actor) -> BudgetLimit:
    """Create a budget (checked by `fleet.inputs.BudgetCreate`) and record it."""
    return create_policy(
        tenant,
        BudgetLimit,
        _fields(budget),
        actor=actor,
        event=Event.FLEET_BUDGET_CREATED,
        subject="budget",
        values=budget_values,
    )


def update_budget(tenant: Tenant, budget_id: int, budget: NewBudget, *, actor: Actor) -> BudgetLimit:
    """Set a budget's terms (checked by `fleet.inputs.BudgetCreate`; its name stays) and record the
    change. A new window counts afresh (the counters are per window); a new cap applies at once."""
    return update_policy(
        tenant,
        BudgetLimit,
        budget_id,
        _fields(budget),
        actor=actor,
        event=Event.FLEET_BUDGET_UPDATED,
        subject="budget",
        values=budget_values,
    )


def delete_budget(tenant: Tenant, budget_id: int, *, actor: Actor) -> None:
    delete_policy(
        tenant,
        BudgetLimit,
        budget_id,
        actor=actor,
        event=Event.FLEET_BUDGET_DELETED,
        subject="budget",
        values=budget_values,
    )
