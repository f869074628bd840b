"""Budget leases (ARCHITECTURE §8.3): units of the budgets a tool meets, granted to one agent ahead
of its calls so that it decides them in process, and given back with what it used.

- `grant` answers `{"decision": "lease", ...}` or `{"decision": "per_call", "reason"}`: a lease
  is granted only where a per-call decision could not answer differently for a call it covers. So
  a halt or drain matching the call, a quarantined saga, a circuit breaker on the tool that is not
  closed, an approval policy on the tool, a rate
  limit on it (GCRA is decided per call), a budget that escalates, an argument that cannot be
  counted, and a budget with too little left for the share a lease may take, all answer
  `per_call`: the agent asks the gate per call, as without leases. A lease never refuses.
- `give_back` records what the holder used (more than granted: an overrun, counted) and returns
  the rest to the counters; once per lease (a retried give-back answers the first).
- The ledger holds every lease: outstanding, it counts all it was granted (also after it
  expired, until it is returned or settled: `fleet.actions.lease_settlement` settles a lease its
  holder never returned at what the holder's shipped WAL proves it used), returned or settled,
  what was used.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from core import availability, epoch, snapshots
from core.actors import Actor
from core.errors import DomainError
from core.scoping import require_tenant
from fleet import gate, hooks, leasestores
from fleet.actions.settings import default_lease_ttl_ms, settle_grace_ms
from fleet.actions.snapshot import Policies, held_policies, read_policies
from fleet.actions.store import gate_tag, get_store
from fleet.gate import Debit, GateRequest, InvalidArgument
from fleet.models import GateLease, HaltMode, LeaseState, OnCap
from fleet.stores import LimitStore, StoreUnavailable
from tenants.models import Tenant

log = logging.getLogger(__name__)

MAX_CALLS = 10_000  # one lease covers at most this many calls' amounts


def ttl_ms(policies: Policies) -> int:
    """How long a lease lives unless renewed: the tenant's setting (`fleet.actions.settings`),
    else the deployment's SAGAPLANE_LEASE_TTL_MS (default 1 s)."""
    return policies.lease_ttl_ms or default_lease_ttl_ms()


def grant(
    tenant: Tenant,
    request: GateRequest,
    *,
    calls: int,
    lease_id: uuid.UUID,
    actor: Actor,
    store: LimitStore | None = None,
) -> dict[str, Any]:
    """A lease of up to `calls` calls like `request` (its tool, agent and the arguments that scope
    its budgets), or `per_call` with the reason. `lease_id` is the caller's: a retried grant
    answers the first. `actor` is the key's (the grant is a ledger row, as a decision is). As the
    tenant (asserted: its transport entered it); the debit's record in a savepoint of its own."""
    require_tenant(tenant)
    availability.guard()
    store = store or get_store()
    version = epoch.read(tenant.pk)
    with snapshots.pinned_epoch(tenant.pk, version):
        existing = GateLease.objects.filter(pk=lease_id).first()
        if existing is not None:
            return _answer(existing)
        policies = held_policies(tenant, version) or read_policies(tenant, version)
        reason = _why_per_call(policies, request)
        if reason:
            return {"decision": "per_call", "reason": reason}
        try:
            debits = gate.debits_for(policies.specs, request, tenant_tag=gate_tag(tenant))
        except InvalidArgument:
            return {"decision": "per_call", "reason": "invalid_argument"}
        if not debits:
            return {"decision": "per_call", "reason": "ungoverned"}
        wants = [replace(d, amount=min(d.amount * max(1, calls), d.cap)) for d in debits]
        minimums = [d.amount for d in debits]
        with transaction.atomic():
            try:
                granted = leasestores.grant(
                    store, tenant.pk, gate_tag(tenant), str(lease_id), wants, minimums
                )
            except StoreUnavailable as exc:
                log.warning("gate: no lease for tenant %s: %s", tenant.pk, exc)
                return {"decision": "per_call", "reason": "limit_store_unavailable"}
            if granted.status == "dup":
                return {"decision": "per_call", "reason": "lease_not_recorded"}
            if granted.status == "short":
                return {"decision": "per_call", "reason": "little_left"}
            late_ms = (time.monotonic() - granted.debited_at) * 1000
            if granted.debited_at and late_ms > getattr(store, "commit_deadline_ms", 1e18):
                return {"decision": "per_call", "reason": "limit_store_unavailable"}
            row = _record(request, lease_id, debits, granted, policies)
    return _answer(row)


def _why_per_call(policies: Policies, request: GateRequest) -> str:
    """Why a per-call decision could answer a call this lease would cover differently ("" when
    none)."""
    if request.reserve is not None:
        return "reservation"  # an estimate settled later: reserved per call
    now = timezone.now()
    for halt in policies.halts:
        if (halt.expires_at is None or halt.expires_at > now) and gate.halt_matches(halt.scope, request):
            return "halted" if halt.mode == HaltMode.HALT else "draining"
    if request.saga_id in policies.quarantined:
        return "quarantined"
    if any(b.state != "closed" and gate.tool_matches(b.tool, request.tool) for b in policies.breakers):
        return "circuit_breaker"  # open: refused per call; half-open: one trial, picked per call
    meets = [s for s in policies.specs if gate.tool_matches(s.tool, request.tool)]
    if any(s.kind == "rate" for s in meets):
        return "rate_limited_per_call"
    if any(s.on_cap == OnCap.ESCALATE for s in meets):
        return "escalates"
    step = hooks.approval_step()
    if step is not None and any(gate.tool_matches(g, request.tool) for g in step.governed_tools()):
        return "approval_policy"
    return ""


def _record(
    request: GateRequest,
    lease_id: uuid.UUID,
    debits: Sequence[Debit],
    granted: leasestores.Grant,
    policies: Policies,
) -> GateLease:
    specs = {s.name: s for s in policies.specs if s.kind == "budget"}
    granted_at = datetime.fromtimestamp(granted.now_ms / 1000, tz=timezone.get_current_timezone())
    expires_at = granted_at + timedelta(milliseconds=ttl_ms(policies))
    return GateLease.objects.create(
        id=lease_id,
        saga_id=request.saga_id,
        tool=request.tool,
        agent=request.agent,
        api_key_prefix=request.api_key_prefix,
        debits=[
            {
                **d.as_ledger(),
                "amount": amount,
                "per_call": d.amount,
                "bucket": bucket,
                "argument": specs[d.limit].argument,
                "per": list(specs[d.limit].per),
            }
            for d, amount, bucket in zip(debits, granted.amounts, granted.buckets, strict=True)
        ],
        granted_ms=granted.now_ms,
        granted_at=granted_at,
        expires_at=expires_at,
        settle_after=expires_at + timedelta(milliseconds=settle_grace_ms()),
    )


def _answer(row: GateLease) -> dict[str, Any]:
    scope_args = {
        p[len(gate.PER_ARG_PREFIX) :]
        for d in row.debits
        for p in d["per"]
        if p.startswith(gate.PER_ARG_PREFIX)
    }
    answer: dict[str, Any] = {
        "decision": "lease",
        "lease_id": str(row.id),
        "state": row.state,
        "ttl_ms": max(0, int((row.expires_at - row.granted_at).total_seconds() * 1000)),
        "tool": row.tool,
        "limits": [
            {
                "limit": d["limit"],
                "argument": d["argument"],
                "scope": d["scope"],
                "granted": gate.from_units(int(d["amount"])),
                "per_call": gate.from_units(int(d["per_call"])),
            }
            for d in row.debits
        ],
        "scope_args": sorted(scope_args),
    }
    overrun = {
        d["limit"]: gate.from_units(int(u) - int(d["amount"]))
        for d, u in zip(row.debits, row.used or [], strict=False)
        if int(u) > int(d["amount"])
    }
    if overrun:
        answer["overrun"] = overrun
    if row.used is not None:
        answer["used"] = {
            d["limit"]: gate.from_units(int(u)) for d, u in zip(row.debits, row.used, strict=True)
        }
    return answer


def give_back(
    tenant: Tenant,
    lease_id: uuid.UUID,
    used: Mapping[str, Any],
    *,
    actor: Actor,
    store: LimitStore | None = None,
) -> dict[str, Any] | None:
    """Record what the lease's holder used of each limit (`{limit name: amount}`, a limit not named
    used nothing) and give the rest back; more than granted is an overrun, recorded and counted
    against the limit, never refused (the effect happened). A lease settled after its expiry
    (`fleet.actions.lease_settlement`) counts what its holder reports beyond what was settled as
    an overrun. None: no such lease. Raises ValueError naming a limit whose amount is not one.
    As the tenant (asserted: its transport entered it), the locked row's change in a transaction
    of its own (a savepoint inside the caller's)."""
    require_tenant(tenant)
    store = store or get_store()
    with transaction.atomic():
        row = GateLease.objects.select_for_update().filter(pk=lease_id).first()
        if row is None:
            return None
        if row.state == LeaseState.RETURNED:
            return _answer(row)
        spent = _spent(row, used)
        if row.state == LeaseState.SETTLED:
            _count_late(tenant, row, spent, store)
        else:
            close(tenant, row, spent, store=store, state=LeaseState.RETURNED)
        return _answer(row)


def _spent(row: GateLease, used: Mapping[str, Any]) -> list[int]:
    names = {d["limit"] for d in row.debits}
    unknown = sorted(set(used) - names)
    if unknown:
        raise ValueError(f"used: no limit '{unknown[0]}' in this lease")
    spent: list[int] = []
    for d in row.debits:
        try:
            spent.append(gate.to_units(gate.amount_sent(used.get(d["limit"], 0))))
        except ValueError as exc:
            raise ValueError(f"used.{d['limit']}: {exc}") from None
    return spent  # more than granted: an overrun, counted (the effect happened)


def close(tenant: Tenant, row: GateLease, spent: list[int], *, store: LimitStore, state: str) -> None:
    """Record `spent` (units per debit) on the locked outstanding `row` and give the rest back to
    the counters. When Redis cannot take an overrun now (or, settling, anything), nothing is
    recorded: DomainError 503, to be done again."""
    debits = [_debit(d) for d in row.debits]
    unused = [int(d["amount"]) - s for d, s in zip(row.debits, spent, strict=True)]
    buckets = [int(d["bucket"]) for d in row.debits]
    try:
        leasestores.give_back(store, gate_tag(tenant), str(row.id), debits, buckets, unused)
    except StoreUnavailable as exc:
        if state == LeaseState.SETTLED or any(u < 0 for u in unused):
            # An overrun must be counted where the next decision reads, not only in the
            # ledger: nothing recorded, the holder asks again (503).
            detail = "the overrun could not be counted now: give the lease back again"
            raise DomainError("limit_store_unavailable", detail, status=503, field="used") from exc
        log.warning("gate: lease %s not given back: %s", row.id, exc)  # stays counted (refusal-biased)
    row.used, row.state, row.returned_at = spent, state, timezone.now()
    row.save(update_fields=["used", "state", "returned_at"])


def _count_late(tenant: Tenant, row: GateLease, spent: list[int], store: LimitStore) -> None:
    """A holder's return after its lease was settled: what it reports beyond what was settled is
    an overrun, counted in the grant's bucket and the ledger (the effects happened)."""
    settled = [int(u) for u in row.used or []]
    extra = [max(0, s - u) for s, u in zip(spent, settled, strict=True)]
    if not any(extra):
        return
    debits = [_debit(d) for d in row.debits]
    buckets = [int(d["bucket"]) for d in row.debits]
    total = sum(settled) + sum(extra)
    try:
        late = f"{row.id}:late:{total}"
        leasestores.give_back(store, gate_tag(tenant), late, debits, buckets, [-e for e in extra])
    except StoreUnavailable as exc:
        detail = "the overrun could not be counted now: give the lease back again"
        raise DomainError("limit_store_unavailable", detail, status=503, field="used") from exc
    row.used = [u + e for u, e in zip(settled, extra, strict=True)]
    row.save(update_fields=["used"])


def _debit(d: Mapping[str, Any]) -> Debit:
    return Debit(
        d["key"], d["kind"], d["limit"], d["scope"], int(d["amount"]), int(d["cap"]), int(d["window_ms"])
    )
