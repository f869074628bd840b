"""Leases whose holder died (ARCHITECTURE §8.3): counted whole until they expire, then settled at
what the holder's shipped WAL proves it used, the rest given back.

- `watch_appended` (`audit.hooks.on_records_appended`, inside the ingest transaction): every
  GATE_ALLOW record that names a lease (the SDK's decision on it, written before the effect) is a
  `LeaseUse` row committed with the record, so what was shipped is what is counted. A record whose
  lease is not a UUID is not one; an amount that is not an amount is left out.
- `claim_due` and `settle` (driven by the walker `fleet.tasks.settle_expired_leases`, run every
  second by the beat process' sweep thread, recovery/sweeper.py, which enters each tenant around
  each unit): `claim_due` claims the tenant's outstanding leases past `settle_after` (expiry plus
  a grace for the shipper) through the one leased-work claim (`core.claims`: a fencing token, a
  30 s claim); `settle` then settles one, in its own transaction, under the row's lock: used =
  the sum of its `LeaseUse` debits per limit (more than granted: an overrun, counted as a
  holder's would be), the rest given back to the bucket the grant was debited to, state
  `settled`. A holder that returns it meanwhile wins (the claim's token no longer holds); one
  that returns it later has what it reports beyond the settlement counted as an overrun
  (`fleet.actions.leases.give_back`). Both assert the tenant's scope.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from sagaplane.events import Event

from audit.hooks import AppendedRecords, OnStored
from core.claims import Leased, claim
from core.scoping import require_tenant
from fleet import gate
from fleet.actions.leases import close
from fleet.actions.store import get_store
from fleet.models import GateLease, LeaseState, LeaseUse
from fleet.stores import LimitStore
from tenants.models import Tenant

SETTLING: Leased[GateLease] = Leased(
    GateLease,
    state="state",
    claimed=LeaseState.OUTSTANDING,  # a claim changes who settles it, not what it counts
    claimable=(LeaseState.OUTSTANDING,),
    token="settle_token",
    holder="settler",
    lease="settle_after",
)
CLAIM_S = 30.0  # a settler that died: another takes the lease over after this
BATCH = 200
SETTLER = "fleet:lease-settlement"
MAX_LIMITS = 32  # a record's debits read (a lease covers the few budgets its tool meets)


def watch_appended(appended: AppendedRecords) -> OnStored:
    uses = [
        use
        for row, fields in appended.items
        if row.event == Event.GATE_ALLOW and fields and (use := _use(appended.tenant, row, fields))
    ]

    def stored(base: int) -> None:
        if uses:
            LeaseUse.objects.bulk_create(uses)

    return stored


def _use(tenant: Tenant, row: Any, fields: dict[str, Any]) -> LeaseUse | None:
    lease, debits = fields.get("lease"), fields.get("debits")
    if not isinstance(lease, str) or len(lease) > 64:
        return None
    try:
        lease_id = uuid.UUID(lease)
    except ValueError:
        return None
    units: dict[str, int] = {}
    if isinstance(debits, dict):
        for name, amount in list(debits.items())[:MAX_LIMITS]:
            counted = _units(amount)
            if isinstance(name, str) and len(name) <= 100 and counted is not None:
                units[name] = counted
    return LeaseUse(tenant=tenant, lease_id=lease_id, saga_id=str(row.saga_id)[:128], debits=units)


def _units(amount: Any) -> int | None:
    """A record's amount (a decimal string, as the SDK writes it, or a JSON number) in units."""
    try:
        if isinstance(amount, str):
            amount = Decimal(amount) if len(amount) <= 40 else None
        return gate.to_units(amount)
    except (ValueError, InvalidOperation):
        return None


def shipped_use(row: GateLease) -> list[int]:
    """Units of each of the lease's debits its shipped GATE_ALLOW records took (active tenant)."""
    names = [d["limit"] for d in row.debits]
    totals = dict.fromkeys(names, 0)
    for debits in LeaseUse.objects.filter(lease_id=row.pk).values_list("debits", flat=True):
        for name, units in (debits or {}).items():
            if name in totals and isinstance(units, int) and units >= 0:
                totals[name] += units
    return [totals[name] for name in names]


def _due(now: datetime) -> Any:
    return GateLease.objects.filter(state=LeaseState.OUTSTANDING, settle_after__lte=now).order_by(
        "settle_after", "pk"
    )


def claim_due(tenant: Tenant, *, now: datetime) -> list[GateLease]:
    """Claim the tenant's leases due by `now` (at most BATCH) for settlement, each with its token."""
    require_tenant(tenant)
    return claim(
        SETTLING,
        _due,
        now=now,
        holder=SETTLER,
        lease_until=now + timedelta(seconds=CLAIM_S),
        limit=BATCH,
        shape=("fleet-lease-settlement", tenant.pk),
    )


def settle(tenant: Tenant, lease_id: uuid.UUID, token: int, *, store: LimitStore | None = None) -> bool:
    """Settle one claimed lease at what its holder shipped; False when its holder returned it
    meanwhile or another settler claimed it since. Raises DomainError while the limit store is
    down: the caller's transaction rolls back and the claim lapses, so a later pass retries."""
    require_tenant(tenant)
    row = GateLease.objects.select_for_update().filter(pk=lease_id).first()
    if row is None or not SETTLING.holds(row, token):
        return False
    close(tenant, row, shipped_use(row), store=store or get_store(), state=LeaseState.SETTLED)
    return True
