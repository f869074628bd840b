"""The fleet's public face for other apps, its views and commands: every state change of the fleet
context, and the gate itself. The code lives in `fleet.actions`, one module per aggregate.

Policy changes (budgets, rate limits, circuit breakers, halts, quarantines, the gate's settings)
take a keyword-only `actor` and append their record (old and new values) to the tenant's server
stream in the same transaction.
"""

from __future__ import annotations

from datetime import datetime

from fleet.actions.breaker_states import (
    BREAKER_ACTOR,
    breaker_phase,
    breakers_met,
    held_breakers,
    read_breakers,
    settle_trial,
    status_entries,
    trip,
)
from fleet.actions.breaker_states import count_outcomes as count_breaker_outcomes
from fleet.actions.breaker_states import outcomes_in as breaker_outcomes_in
from fleet.actions.breakers import breaker_values, create_breaker, delete_breaker, update_breaker
from fleet.actions.budgets import budget_values, create_budget, delete_budget, update_budget
from fleet.actions.changes import policies_changed, version_key
from fleet.actions.decision import evaluate
from fleet.actions.halts import halt, halt_values, resume
from fleet.actions.lease_settlement import PRUNE_BATCH as LEASE_PRUNE_BATCH
from fleet.actions.lease_settlement import USES_KEPT_FOR as LEASE_USES_KEPT_FOR
from fleet.actions.lease_settlement import claim_due as claim_due_leases
from fleet.actions.lease_settlement import prune_uses as prune_lease_uses
from fleet.actions.lease_settlement import settle as settle_lease
from fleet.actions.lease_settlement import shipped_use as lease_shipped_use
from fleet.actions.leases import MAX_CALLS as LEASE_MAX_CALLS
from fleet.actions.leases import give_back as give_back_lease
from fleet.actions.leases import grant as grant_lease
from fleet.actions.ledger import (
    DENIALS_KEPT_FOR,
    budget_usage,
    prune_denials,
    rate_usage,
    recent_denials,
    spend_since,
)
from fleet.actions.ledger import (
    PRUNE_BATCH as DENIALS_PRUNE_BATCH,
)
from fleet.actions.quarantine import quarantine, refuse_unknown_saga
from fleet.actions.rate_limits import (
    create_rate_limit,
    delete_rate_limit,
    rate_limit_values,
    update_rate_limit,
)
from fleet.actions.reservations import settle as settle_reservation
from fleet.actions.reservations import settle_saga as settle_saga_reservations
from fleet.actions.settings import fleet_settings_values, set_fleet_settings
from fleet.actions.snapshot import (
    breaker_spec,
    breakers_not_closed,
    forget_policies,
    governed_tools,
    halts_in_force,
)
from fleet.actions.store import gate_tag, get_store, ledger_since, set_store
from fleet.inputs import (
    MAX_WINDOW_S,
    BreakerChange,
    BreakerCreate,
    BreakerUpdate,
    BudgetCreate,
    FleetSettingsChange,
    FleetSettingsUpdate,
    GateLeaseReturn,
    GateSettle,
    HaltCreate,
    LeaseUse,
    NewBreaker,
    NewBudget,
    NewHalt,
    NewRateLimit,
    QuarantineAsk,
    QuarantineAsked,
    QuarantineCreate,
    QuarantineTerms,
    RateLimitCreate,
    Settlement,
)
from fleet.stores import DatabaseStore


def settle_all_expired_leases(now: datetime | None = None) -> int:
    """Every tenant's budget leases that expired unreturned, settled: one pass of the walker,
    `fleet.tasks.settle_expired_leases`, which enters each tenant around each unit of work. Named
    here for the beat process' sweep thread (recovery/sweeper.py), which reaches fleet through its
    services and runs the pass in its own thread, so no busy queue can starve it."""
    from fleet.tasks import settle_expired_leases  # fleet.tasks imports this module

    return int(settle_expired_leases(now))


__all__ = [
    "BREAKER_ACTOR",
    "DENIALS_KEPT_FOR",
    "DENIALS_PRUNE_BATCH",
    "LEASE_PRUNE_BATCH",
    "LEASE_USES_KEPT_FOR",
    "MAX_WINDOW_S",
    "BreakerChange",
    "BreakerCreate",
    "BreakerUpdate",
    "BudgetCreate",
    "FleetSettingsChange",
    "FleetSettingsUpdate",
    "fleet_settings_values",
    "set_fleet_settings",
    "LEASE_MAX_CALLS",
    "DatabaseStore",
    "NewBreaker",
    "breaker_phase",
    "breaker_spec",
    "breaker_values",
    "breakers_not_closed",
    "create_breaker",
    "delete_breaker",
    "breaker_outcomes_in",
    "breakers_met",
    "count_breaker_outcomes",
    "held_breakers",
    "read_breakers",
    "settle_trial",
    "trip",
    "update_breaker",
    "update_budget",
    "update_rate_limit",
    "HaltCreate",
    "NewBudget",
    "NewHalt",
    "NewRateLimit",
    "GateLeaseReturn",
    "LeaseUse",
    "QuarantineAsk",
    "QuarantineAsked",
    "QuarantineCreate",
    "QuarantineTerms",
    "RateLimitCreate",
    "GateSettle",
    "Settlement",
    "budget_usage",
    "budget_values",
    "create_budget",
    "create_rate_limit",
    "delete_budget",
    "delete_rate_limit",
    "evaluate",
    "forget_policies",
    "gate_tag",
    "get_store",
    "give_back_lease",
    "lease_shipped_use",
    "claim_due_leases",
    "settle_all_expired_leases",
    "settle_lease",
    "governed_tools",
    "grant_lease",
    "halt",
    "halt_values",
    "halts_in_force",
    "ledger_since",
    "policies_changed",
    "prune_denials",
    "prune_lease_uses",
    "quarantine",
    "refuse_unknown_saga",
    "rate_limit_values",
    "rate_usage",
    "recent_denials",
    "resume",
    "set_store",
    "settle_reservation",
    "settle_saga_reservations",
    "spend_since",
    "status_entries",
    "version_key",
]
