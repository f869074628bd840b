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
- `prune_uses` (driven hourly by the walker `fleet.tasks.prune_old_rows`, entering each tenant
  around each batch): a use is read only while its lease is outstanding (`shipped_use`, by
  `settle`); once the lease is returned or settled nothing reads it again (a late return compares
  with the lease's `used`), and the GATE_ALLOW record it was counted from stays in the evidence
  store. So a use received more than USES_KEPT_FOR ago whose lease is not outstanding (or that
  names no lease of the tenant) is deleted, at most one batch per call.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.utils import timezone
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
# A closed lease's uses are kept this long after they were received: nothing reads them once the
# lease is closed, so this is only a margin for an operator comparing a settlement with its uses.
USES_KEPT_FOR = timedelta(days=1)
PRUNE_BATCH = 5_000  # uses deleted by one `prune_uses` call (one short transaction)


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


def prune_uses(
    tenant: Tenant,
    *,
    now: datetime | None = None,
    kept_for: timedelta = USES_KEPT_FOR,
    limit: int = PRUNE_BATCH,
) -> int:
    """Delete at most `limit` of the tenant's uses received before `now - kept_for` whose lease is
    no longer outstanding (or names no lease of the tenant), oldest first; how many were. An
    outstanding lease's uses stay whatever their age: its settlement reads them. A lease never
    becomes outstanding again, so a use found prunable stays so until it is deleted."""
    require_tenant(tenant)
    cutoff = (now or timezone.now()) - kept_for
    open_leases = GateLease.objects.filter(state=LeaseState.OUTSTANDING).values("pk")
    batch = list(
        LeaseUse.objects.filter(received_at__lt=cutoff)
        .exclude(lease_id__in=open_leases)
        .order_by("received_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    if not batch:
        return 0
    deleted, _ = LeaseUse.objects.filter(pk__in=batch).delete()
    return deleted
