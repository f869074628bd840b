"""Reading and pruning the gate's ledger of decisions (`GateDecision`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from core.scoping import require_tenant
from fleet import gate
from fleet.models import BudgetLimit, Decision, GateDecision, GateLease, LeaseState, RateLimit
from tenants.models import Tenant


def budget_usage(limit: BudgetLimit, now: datetime | None = None) -> list[dict[str, Any]]:
    """Spend per scope of one budget over its window, read from the ledger (the durable truth):
    allowed calls, plus every lease granted in the window — all it was granted while outstanding
    (`leased` says how much of `used` that is), what its holder used once returned; a reservation
    at its reserve while open (`reserved`), at its actual once settled (`settled`, and `overrun`:
    what actuals exceeded their reserves by, counted in `used`)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=limit.window_s)
    totals: dict[str, int] = {}
    leased: dict[str, int] = {}
    held: dict[str, dict[str, int]] = {"reserved": {}, "settled": {}, "overrun": {}}
    rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
        "debits", "detail"
    )
    for debits, detail in rows.iterator():
        for debit in debits:
            if debit.get("kind") == "budget" and debit.get("limit") == limit.name:
                totals[debit["scope"]] = totals.get(debit["scope"], 0) + int(debit["amount"])
                _count_reservation(held, debit["scope"], detail.get("reservation"))
    for lease in GateLease.objects.filter(granted_at__gte=since):
        for debit, units in zip(lease.debits, lease.counted(), strict=True):
            if debit.get("limit") == limit.name:
                totals[debit["scope"]] = totals.get(debit["scope"], 0) + units
                if lease.state == LeaseState.OUTSTANDING:
                    leased[debit["scope"]] = leased.get(debit["scope"], 0) + units
    cap = gate.to_units(limit.max_total)
    return [
        {
            "scope": scope,
            "used": gate.from_units(used),
            "leased": gate.from_units(leased.get(scope, 0)),
            **{kind: gate.from_units(units.get(scope, 0)) for kind, units in held.items()},
            "cap": gate.from_units(cap),
            "ratio": used / cap if cap else 1,
        }
        for scope, used in sorted(totals.items())
    ]


def _count_reservation(held: dict[str, dict[str, int]], scope: str, reservation: Any) -> None:
    if not reservation:
        return
    if reservation["state"] == "open":
        held["reserved"][scope] = held["reserved"].get(scope, 0) + int(reservation["reserved"])
        return
    actual = int(reservation["actual"])
    held["settled"][scope] = held["settled"].get(scope, 0) + actual
    over = max(0, actual - int(reservation["reserved"]))
    held["overrun"][scope] = held["overrun"].get(scope, 0) + over


def rate_usage(limit: RateLimit, now: datetime | None = None) -> list[dict[str, Any]]:
    """Calls allowed per scope of one rate limit over its window, read from the ledger (GCRA
    spreads them smoothly, so a scope can be refused below `max_calls` after a burst)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=limit.window_s)
    counts: dict[str, int] = {}
    rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
        "debits", flat=True
    )
    for debits in rows.iterator():
        for debit in debits:
            if debit.get("kind") == "rate" and debit.get("limit") == limit.name:
                counts[debit["scope"]] = counts.get(debit["scope"], 0) + 1
    return [
        {"scope": scope, "used": used, "cap": limit.max_calls, "ratio": used / limit.max_calls}
        for scope, used in sorted(counts.items())
    ]


def spend_since(since: datetime) -> tuple[int, int]:
    """The fleet's spend as agent-saga's `get_fleet_budget` reports it, from the ledger: (units of
    budgeted arguments that allowed calls and leases since `since` spent, each call counted once —
    its largest budget debit when several budgets matched it; a lease what it counts (`GateLease.
    counted`), its largest debit likewise —, and how many distinct agents were allowed)."""
    units = 0
    agents: set[str] = set()
    rows = GateDecision.objects.filter(decision=Decision.ALLOW, decided_at__gte=since).values_list(
        "agent", "api_key_prefix", "debits"
    )
    for agent, key_prefix, debits in rows.iterator():
        agents.add(agent or f"key:{key_prefix}")
        units += max((int(d["amount"]) for d in debits if d.get("kind") == "budget"), default=0)
    for lease in GateLease.objects.filter(granted_at__gte=since):
        agents.add(lease.agent or f"key:{lease.api_key_prefix}")
        units += max(lease.counted(), default=0)
    return units, len(agents)


# -------------------------------------------------------------------------------------- the policies


def recent_denials(limit: int = 50) -> Sequence[GateDecision]:
    return list(GateDecision.objects.filter(decision=Decision.DENY).order_by("-decided_at")[:limit])


DENIALS_KEPT_FOR = timedelta(days=30)
PRUNE_BATCH = 5_000  # refusals deleted by one `prune_denials` call (one short transaction)


def prune_denials(tenant: Tenant, *, now: datetime | None = None, limit: int = PRUNE_BATCH) -> int:
    """Forget at most `limit` refusals older than DENIALS_KEPT_FOR, oldest first (they debited
    nothing and are only shown as recent denials; the agent's WAL keeps its own GATE_DENY
    records); how many were. Allows are never pruned: they are the budget ledger."""
    require_tenant(tenant)
    cutoff = (now or timezone.now()) - DENIALS_KEPT_FOR
    batch = list(
        GateDecision.objects.filter(decision=Decision.DENY, decided_at__lt=cutoff)
        .order_by("decided_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    if not batch:
        return 0
    GateDecision.objects.filter(pk__in=batch).delete()
    return len(batch)
