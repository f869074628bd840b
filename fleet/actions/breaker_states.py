"""Circuit breakers' states: closed → open (by the outcomes agents ship) → half-open (one trial
call, let through by the gate) → closed (the trial succeeded) or open again (it failed).

Every transition is one transaction: the breaker's row (locked, its state re-checked), its
history row (`BreakerTransition`) and the `FLEET_BREAKER_TRANSITION` record of the tenant's
server stream with the old and new state, then the tenant's change signal, so every process' gate
re-reads its policies and every agent's fleet status long-poll answers.

Outcomes arrive through `audit.hooks.after_records_committed` (`fleet.tasks.outcomes_committed`,
the transport that enters the tenant around each piece of work here, each committing on its own):
a committed batch's `STEP_FAILED` and `STEP_UNKNOWN` count as failures, `STEP_COMMITTED` as
successes, for every closed breaker whose glob matches the step's tool, in the gate's limit store
(`fleet.breaker_counts`). While half-open, only the trial's own outcome counts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.utils import timezone
from sagaplane.events import Event

from audit.hooks import AppendedRecords
from core.actionaudit import append_server_record
from core.scoping import require_tenant
from fleet import gate
from fleet.actions.changes import changed_after_commit
from fleet.actions.snapshot import (
    breaker_spec,
    breakers_not_closed,
    held_policies,
    millis,
    read_policies,
)
from fleet.actions.store import gate_tag, get_store
from fleet.breaker_counts import counts_for
from fleet.gate import BreakerSpec, GateRequest
from fleet.models import BreakerState, BreakerTransition, CircuitBreaker
from fleet.stores import StoreUnavailable
from tenants.actors import system_actor
from tenants.models import Tenant

log = logging.getLogger(__name__)

BREAKER_ACTOR = system_actor("breaker")
# Whether a step's outcome record counts as a failure.
FAILED_BY_EVENT: dict[str, bool] = {
    Event.STEP_COMMITTED: False,
    Event.STEP_FAILED: True,
    Event.STEP_UNKNOWN: True,
}


class Outcome(NamedTuple):
    tool: str
    saga_id: str
    step_id: str
    failed: bool


def _move(tenant: Tenant, row: CircuitBreaker, new_state: str, reason: str, **fields: Any) -> None:
    """Record one transition of a row locked by the caller (inside the tenant's transaction)."""
    now = timezone.now()
    old_state = row.state
    for name, value in fields.items():
        setattr(row, name, value)
    row.state, row.updated_at = new_state, now
    row.save()
    BreakerTransition.objects.create(
        breaker=row,
        old_state=old_state,
        new_state=new_state,
        reason=reason[:300],
        actor=str(BREAKER_ACTOR),
        at=now,
    )
    record = {
        "breaker": row.pk,
        "name": row.name,
        "tool": row.tool,
        "old": {"state": old_state},
        "new": {"state": new_state},
        "reason": reason,
    }
    append_server_record(tenant, Event.FLEET_BREAKER_TRANSITION, record, actor=BREAKER_ACTOR)
    changed_after_commit(tenant)


# ------------------------------------------------------------------------------------------ the gate


def breaker_phase(row: CircuitBreaker) -> str:
    """closed, open, trial_due (the next call is let through as the trial) or trial_running."""
    return gate.breaker_phase(breaker_spec(row), millis(timezone.now()) or 0)


def status_entries() -> list[dict[str, Any]]:
    """The breakers an agent must know of (the fleet status): `open` refuses locally, `half_open`
    (a trial due or out) asks the gate, which lets one call through."""
    return [
        {"name": b.name, "tool": b.tool, "state": "open" if breaker_phase(b) == "open" else "half_open"}
        for b in breakers_not_closed()
    ]


def claim_trial(tenant: Tenant, spec: BreakerSpec, request: GateRequest) -> bool:
    """Inside the tenant's transaction: may this call go through `spec`'s breaker, whose trial is
    due by the gate's snapshot? True for exactly one call per cool-down across every process (the
    row is locked and its phase re-read: the first makes it half-open with this call as the trial,
    every later one finds the trial running), and for any call once the breaker closed or went."""
    row = CircuitBreaker.objects.select_for_update().filter(pk=spec.id).first()
    if row is None:
        return True
    now = timezone.now()
    phase = gate.breaker_phase(breaker_spec(row), millis(now) or 0)
    if phase == "closed":
        return True
    if phase != "trial_due":
        return (row.trial_saga_id, row.trial_step_id) == (request.saga_id, request.step_id)
    why = "cool-down over" if row.state == BreakerState.OPEN else "the last trial's outcome never came"
    reason = f"{why}: one trial call let through (saga {request.saga_id}, step {request.step_id})"
    _move(
        tenant,
        row,
        BreakerState.HALF_OPEN,
        reason,
        trial_saga_id=request.saga_id[:128],
        trial_step_id=request.step_id[:128],
        trial_at=now,
    )
    return True


# ----------------------------------------------------------------------------------- the outcomes


class Met(NamedTuple):
    """A breaker a batch's outcomes concern: a closed one's matching outcomes, to count, or a
    half-open one's trial outcome (`trial`), to settle it."""

    spec: BreakerSpec
    outcomes: list[Outcome]
    trial: Outcome | None


def outcomes_in(appended: AppendedRecords) -> list[Outcome]:
    """The batch's step outcomes a breaker counts (no read)."""
    return [
        Outcome(row.tool, row.saga_id, row.step_id, FAILED_BY_EVENT[row.event])
        for row, _ in appended.items
        if row.event in FAILED_BY_EVENT and row.tool
    ]


def held_breakers(tenant: Tenant, version: Any) -> list[BreakerSpec] | None:
    """The tenant's breakers from this process' snapshot while current under `version` (no read),
    else None: `read_breakers` then reads them."""
    held = held_policies(tenant, version)
    return None if held is None else held.breakers


def read_breakers(tenant: Tenant, version: Any) -> list[BreakerSpec]:
    """The tenant's breakers, read (and the policies' snapshot kept under `version`)."""
    require_tenant(tenant)
    return read_policies(tenant, version).breakers


def breakers_met(breakers: Sequence[BreakerSpec], outcomes: Sequence[Outcome]) -> list[Met]:
    """The breakers `outcomes` concern, in order: a closed breaker whose glob matches some, a
    half-open one whose trial's own outcome is among them (only the trial's counts while half-open)."""
    met: list[Met] = []
    for spec in breakers:
        mine = [o for o in outcomes if gate.tool_matches(spec.tool, o.tool)]
        if not mine:
            continue
        if spec.state == BreakerState.CLOSED:
            met.append(Met(spec, mine, None))
        elif spec.state == BreakerState.HALF_OPEN:
            trial = next((o for o in mine if (o.saga_id, o.step_id) == spec.trial), None)
            if trial is not None:
                met.append(Met(spec, mine, trial))
    return met


def count_outcomes(tenant: Tenant, spec: BreakerSpec, outcomes: Sequence[Outcome]) -> str | None:
    """Add a closed breaker's outcomes to its counts (the gate's store; as the tenant, asserted:
    the database store writes its rows); the reason to trip it now, else None. A store that cannot
    be reached counts nothing (logged)."""
    require_tenant(tenant)
    try:
        tally = counts_for(get_store()).add(tenant.pk, gate_tag(tenant), spec, [o.failed for o in outcomes])
    except StoreUnavailable as exc:
        log.warning("breaker %s: outcomes not counted: %s", spec.name, exc)
        return None
    return gate.trip_reason(spec, tally)


def trip(tenant: Tenant, spec: BreakerSpec, reason: str) -> bool:
    """Open a closed breaker (the generation its counts belong to): False when it already moved.
    As the tenant, in its transaction (asserted): the transition is the caller's unit of work."""
    require_tenant(tenant)
    row = CircuitBreaker.objects.select_for_update().filter(pk=spec.id).first()
    if row is None or row.state != BreakerState.CLOSED or row.generation != spec.generation:
        return False
    _move(tenant, row, BreakerState.OPEN, reason, opened_at=timezone.now())
    return True


def settle_trial(tenant: Tenant, spec: BreakerSpec, *, failed: bool) -> bool:
    """The trial's outcome: a success closes the breaker (its counts start afresh), a failure opens
    it again for another cool-down. False when the trial is no longer the one running. As the
    tenant, in its transaction (asserted): the transition is the caller's unit of work."""
    require_tenant(tenant)
    row = CircuitBreaker.objects.select_for_update().filter(pk=spec.id).first()
    if (
        row is None
        or row.state != BreakerState.HALF_OPEN
        or (row.trial_saga_id, row.trial_step_id) != spec.trial
    ):
        return False
    trial = f"saga {row.trial_saga_id}, step {row.trial_step_id}"
    cleared: dict[str, Any] = {"trial_saga_id": "", "trial_step_id": "", "trial_at": None}
    if failed:
        _move(
            tenant,
            row,
            BreakerState.OPEN,
            f"the trial call failed ({trial})",
            opened_at=timezone.now(),
            **cleared,
        )
    else:
        _move(
            tenant,
            row,
            BreakerState.CLOSED,
            f"the trial call succeeded ({trial})",
            opened_at=None,
            generation=row.generation + 1,
            **cleared,
        )
    return True
