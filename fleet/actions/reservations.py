"""Reserve, then settle (ARCHITECTURE §8.3): a call whose cost is known only after it ran (LLM
tokens, a metered API) is allowed on an estimate, and its real amount settled afterwards.

- A gate call with `reserve` debits the estimate from every budget it meets, instead of its
  argument, in the same atomic check-and-debit as any call (`opened` marks the allow's ledger row
  as an open reservation, with the store's clock at the debit: the bucket to settle in).
- `settle` records the actual amount once: the difference returns to the budgets (never below
  zero in a bucket), an actual above the reserve is an overrun, added to the counters and counted
  against the limit, never refused (the effect happened). The ledger row's budget debits then
  hold the actual amount, so usage, `spend_since` and rebuilds count it as they count any allow;
  the reserve stays in its detail. A settled reservation answers its settlement again.
- A reservation the agent never settles is settled at its reserve when the saga's end record
  (`SAGA_COMPLETE`, `SAGA_ABORTED`) is ingested (`records_appended`): nothing returns, nothing is
  added — until then it was counted at its reserve anyway.
- Settlements reach the server in the agent's WAL: a step's outcome record names the reservation
  and the actual (`settle`), settled in the ingest's transaction (`records_appended`), so an
  accepted record is never lost; `POST /api/v1/gate/reservations/<id>/settle` does the same
  for clients without a WAL.

Invariant: spent + outstanding leases + open reservations (at their reserve) ≤ every cap, as the
debit is checked; overruns are counted once settled, never refused.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from sagaplane.events import Event

from audit.hooks import AppendedRecords, OnStored
from core.actors import Actor, stored
from core.errors import DomainError
from core.scoping import require_tenant
from fleet import gate, leasestores
from fleet.actions.store import gate_tag, get_store
from fleet.gate import Debit, GateRequest
from fleet.inputs import Settlement
from fleet.models import Decision, GateDecision, reservation_answer
from fleet.stores import LimitStore, StoreUnavailable
from tenants.actors import named_actor
from tenants.models import Tenant

log = logging.getLogger(__name__)

OPEN, SETTLED = "open", "settled"
SAGA_ENDS = frozenset({Event.SAGA_COMPLETE.value, Event.SAGA_ABORTED.value})


def opened(request: GateRequest, debits: Sequence[Debit], store_ms: int) -> dict[str, Any] | None:
    """The allow's detail when it opens a reservation (a reserve, and a budget it debits)."""
    if request.reserve is None or not any(d.kind == "budget" for d in debits):
        return None
    return {"reservation": {"state": OPEN, "reserved": request.reserve, "store_ms": store_ms}}


def settle(
    tenant: Tenant,
    reservation_id: uuid.UUID,
    settlement: Settlement,
    *,
    actor: Actor,
    settled_by: str = "api",
    store: LimitStore | None = None,
) -> dict[str, Any] | None:
    """Settle one reservation at what the call really cost; its answer, or None when the tenant
    has no such reservation. DomainError 503 when an overrun cannot be counted now (nothing
    recorded: settle again). As the tenant (asserted: its transport entered it), the locked row's
    change in a transaction of its own (a savepoint inside the caller's)."""
    require_tenant(tenant)
    units = gate.to_units(settlement.actual)
    with transaction.atomic():
        row = (
            GateDecision.objects.select_for_update()
            .filter(pk=reservation_id, decision=Decision.ALLOW)
            .first()
        )
        if row is None or not row.detail.get("reservation"):
            return None
        answer = _settle_row(tenant, row, units, actor=actor, settled_by=settled_by, store=store)
        row.save(update_fields=["debits", "detail"])
        return answer


def _settle_row(
    tenant: Tenant,
    row: GateDecision,
    units: int,
    *,
    actor: Actor,
    settled_by: str,
    store: LimitStore | None,
) -> dict[str, Any]:
    """In the caller's transaction, `row` locked."""
    held = row.detail["reservation"]
    if held["state"] != OPEN:
        return reservation_answer(row)
    back = int(held["reserved"]) - units  # > 0: returned; < 0: an overrun, added
    budgets = [d for d in row.debits if d["kind"] == "budget"]
    if back:
        debits = [_debit(d) for d in budgets]
        buckets = [int(held["store_ms"]) // d.bucket_ms for d in debits]
        try:
            leasestores.give_back(
                store or get_store(),
                gate_tag(tenant),
                f"settle:{row.pk}",
                debits,
                buckets,
                [back] * len(debits),
            )
        except StoreUnavailable as exc:
            if back < 0:  # an overrun must be counted where the next decision reads
                detail = "the overrun could not be counted now: settle again"
                raise DomainError("limit_store_unavailable", detail, status=503, field="actual") from exc
            log.warning("gate: reservation %s not given back: %s", row.pk, exc)  # stays counted
    row.debits = [{**d, "amount": units} if d["kind"] == "budget" else d for d in row.debits]
    row.detail = {
        **row.detail,
        "reservation": {
            **held,
            "state": SETTLED,
            "actual": units,
            "settled_by": settled_by,
            "actor": stored(actor),
            "settled_at": timezone.now().isoformat(),
        },
    }
    return reservation_answer(row)


def settle_saga(tenant: Tenant, saga_id: str, *, actor: Actor) -> int:
    """Settle the saga's open reservations at their reserve (its end was ingested); how many. As
    the tenant (asserted), in a transaction (a savepoint) of its own."""
    require_tenant(tenant)
    with transaction.atomic():
        return _settle_batch(tenant, {}, {saga_id}, actor=actor)


def _settle_batch(tenant: Tenant, settlements: dict[str, Any], ended: set[str], *, actor: Actor) -> int:
    """In the caller's transaction, as the tenant: settle each reservation named in `settlements`
    ({id: actual}) at its actual, then what is left open of the `ended` sagas' at their reserve.
    Set-based: one locking read and one write, whatever the number. How many were settled."""
    named = Q(pk__in=list(settlements)) if settlements else Q(pk__in=[])
    ends = Q(saga_id__in=sorted(ended), detail__reservation__state=OPEN) if ended else Q(pk__in=[])
    rows = list(GateDecision.objects.select_for_update().filter(named | ends, decision=Decision.ALLOW))
    changed = []
    for row in sorted(rows, key=lambda r: str(r.pk) not in settlements):  # named ones first
        held = row.detail.get("reservation")
        if not held or held["state"] != OPEN:
            continue
        if str(row.pk) in settlements:
            try:
                units, how = gate.to_units(gate.amount_sent(settlements[str(row.pk)])), "wal"
            except ValueError as exc:
                log.warning("gate: settlement of %s in a shipped record ignored: %s", row.pk, exc)
                if row.saga_id not in ended:
                    continue
                units, how = int(held["reserved"]), "saga_end"
        elif row.saga_id in ended:
            units, how = int(held["reserved"]), "saga_end"
        else:
            continue
        _settle_row(tenant, row, units, actor=actor, settled_by=how, store=None)
        changed.append(row)
    if changed:
        GateDecision.objects.bulk_update(changed, ["debits", "detail"])
    return len(changed)


def records_appended(appended: AppendedRecords) -> OnStored:
    """`audit.hooks` subscriber, in the ingest's transaction: a step outcome naming a settlement
    (`settle: {"reservation_id", "actual"}`) settles it, a saga's end record settles what is left
    of its reservations at their reserve (one locking read for the whole batch). A settlement
    that cannot be applied now (an overrun with the limit store down) fails the batch: the agent
    ships it again. One whose reservation is unknown, or whose actual is not an amount, is
    ignored (the record is kept)."""
    settlements: dict[str, Any] = {}
    ended: set[str] = set()
    for row, fields in appended.items:
        settlement = fields.get("settle") if isinstance(fields, dict) else None
        if isinstance(settlement, dict):
            try:
                settlements[str(uuid.UUID(str(settlement.get("reservation_id"))[:40]))] = settlement.get(
                    "actual"
                )
            except ValueError:
                log.warning("gate: a settlement names no reservation id: ignored")
        elif row.event in SAGA_ENDS and row.saga_id:
            ended.add(row.saga_id)

    def stored(_base: int) -> None:
        if settlements or ended:
            # In the ingest's transaction, as the tenant its transport entered: a failure fails the batch.
            require_tenant(appended.tenant)
            _settle_batch(appended.tenant, settlements, ended, actor=_shipper(appended))

    return stored


def _shipper(appended: AppendedRecords) -> Actor:
    return named_actor(appended.actor or "shipper")


def _debit(d: dict[str, Any]) -> Debit:
    return Debit(
        d["key"], d["kind"], d["limit"], d["scope"], int(d["amount"]), int(d["cap"]), int(d["window_ms"])
    )
