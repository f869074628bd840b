"""What the gate reads of a tenant's policies, and this process' snapshot of it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from core.snapshots import SnapshotCache
from fleet import gate, hooks
from fleet.gate import BreakerSpec, LimitSpec
from fleet.models import (
    BreakerState,
    BudgetLimit,
    CircuitBreaker,
    FleetSettings,
    Halt,
    Quarantine,
    RateLimit,
)
from tenants.models import Tenant


def limit_specs() -> list[LimitSpec]:
    budgets = [
        LimitSpec(
            id=b.pk,
            kind="budget",
            name=b.name,
            tool=b.tool,
            per=tuple(b.per),
            window_s=b.window_s,
            cap_units=gate.to_units(b.max_total),
            argument=b.argument,
            on_cap=b.on_cap,
        )
        for b in BudgetLimit.objects.order_by("pk")
    ]
    rates = [
        LimitSpec(
            id=r.pk,
            kind="rate",
            name=r.name,
            tool=r.tool,
            per=tuple(r.per),
            window_s=r.window_s,
            cap_units=r.max_calls,
        )
        for r in RateLimit.objects.order_by("pk")
    ]
    return budgets + rates


def halts_in_force(now: datetime | None = None) -> list[Halt]:
    now = now or timezone.now()
    return list(
        Halt.objects.filter(lifted_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .order_by("created_at", "pk")
    )


def millis(moment: Any) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def breaker_spec(row: CircuitBreaker) -> BreakerSpec:
    return BreakerSpec(
        id=row.pk,
        name=row.name,
        tool=row.tool,
        state=row.state,
        generation=row.generation,
        consecutive_failures=row.consecutive_failures,
        rate_units=gate.to_units(row.failure_rate),
        min_volume=row.min_volume,
        window_s=row.window_s,
        cool_down_s=row.cool_down_s,
        opened_at_ms=millis(row.opened_at),
        trial_at_ms=millis(row.trial_at),
        trial=(row.trial_saga_id, row.trial_step_id),
    )


def breaker_specs() -> list[BreakerSpec]:
    return [breaker_spec(row) for row in CircuitBreaker.objects.order_by("pk")]


def breakers_not_closed() -> list[CircuitBreaker]:
    """The breakers that refuse calls (open, or half-open with one trial let through)."""
    return list(CircuitBreaker.objects.exclude(state=BreakerState.CLOSED).order_by("name"))


# ----------------------------------------------------------------------------- policy snapshot


@dataclass(frozen=True)
class Policies:
    """What the gate needs of a tenant's policies, read once and reused while the tenant's epoch
    reads as it did before they were read (`core.snapshots`): its limits, its halts not lifted (each
    checked against its expiry at use), its quarantined sagas and its circuit breakers."""

    specs: list[LimitSpec]
    halts: list[Halt]
    quarantined: frozenset[str]
    breakers: list[BreakerSpec]
    lease_ttl_ms: int | None = None  # the tenant's own (FleetSettings); None: the default


_SNAPSHOTS: SnapshotCache[Policies] = SnapshotCache()


def served_tags() -> list[str]:
    """The gate tags of the tenants this process holds a snapshot of (served recently)."""
    return _SNAPSHOTS.keys()


def forget_policies(tenant: Tenant) -> None:
    """Drop this process' snapshot of the tenant's policies (a change here, or a test)."""
    _SNAPSHOTS.forget(tenant)


def held_policies(tenant: Tenant, version: Any) -> Policies | None:
    """This process' snapshot, while it is current under `version` (`core.snapshots`)."""
    return _SNAPSHOTS.held(tenant, version)


def read_policies(tenant: Tenant, version: Any) -> Policies:
    """Read the tenant's policies (inside its tenant context) and keep them under `version`."""
    return _SNAPSHOTS.read(tenant, version, _read)


def _read() -> Policies:
    return Policies(
        specs=limit_specs(),
        halts=list(Halt.objects.filter(lifted_at__isnull=True).order_by("created_at", "pk")),
        quarantined=frozenset(
            Quarantine.objects.filter(released_at__isnull=True).values_list("saga_id", flat=True)
        ),
        breakers=breaker_specs(),
        lease_ttl_ms=FleetSettings.objects.values_list("lease_ttl_ms", flat=True).first(),
    )


def governed_tools() -> list[str]:
    """The tool globs some limit applies to (halts and quarantines apply to every call)."""
    globs = set(BudgetLimit.objects.values_list("tool", flat=True))
    globs |= set(RateLimit.objects.values_list("tool", flat=True))
    step = hooks.approval_step()
    if step is not None:
        globs |= set(step.governed_tools())
    return sorted(globs)
