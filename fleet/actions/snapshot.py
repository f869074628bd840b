"""What the gate reads of a tenant's policies, and this process' snapshot of it."""

from __future__ import annotations

import contextvars
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from fleet import gate, hooks
from fleet.actions.store import gate_tag
from fleet.gate import LimitSpec
from fleet.models import BudgetLimit, Halt, Quarantine, RateLimit
from tenants import epoch
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


# ----------------------------------------------------------------------------- policy snapshot

SNAPSHOTS_KEPT = 1000


@dataclass(frozen=True)
class Policies:
    """What the gate needs of a tenant's policies, read once and reused while the tenant's epoch
    (`tenants.epoch`) reads as it did before they were read: its limits, its halts not lifted (each
    checked against its expiry at use) and its quarantined sagas."""

    specs: list[LimitSpec]
    halts: list[Halt]
    quarantined: frozenset[str]
    version: Any
    read_at: float


# Keyed by the tenant's gate tag (id and creation time), not its id: ids repeat where a database
# is re-created (SQLite tests reuse them after each rollback), a tenant's creation time does not.
_snapshots: OrderedDict[str, Policies] = OrderedDict()
_snapshots_lock = threading.Lock()
# The epoch the decision running in this context read: the approval step's own snapshot reuses it
# (one cache read per decision, not one per snapshot).
_decision_epoch: contextvars.ContextVar[tuple[int, Any] | None] = contextvars.ContextVar(
    "fleet_decision_epoch", default=None
)


def current_version(tenant_id: int) -> Any:
    """The tenant's change counter (None when the cache cannot be read: then nothing is reused);
    inside a decision, the value that decision read."""
    held = _decision_epoch.get()
    if held is not None and held[0] == tenant_id:
        return held[1]
    return epoch.read(tenant_id)


def served_tags() -> list[str]:
    """The gate tags of the tenants this process holds a snapshot of (served recently)."""
    with _snapshots_lock:
        return list(_snapshots)


def forget_policies(tenant: Tenant) -> None:
    """Drop this process' snapshot of the tenant's policies (a change here, or a test)."""
    with _snapshots_lock:
        _snapshots.pop(gate_tag(tenant), None)


def held_policies(tenant: Tenant, version: Any) -> Policies | None:
    """This process' snapshot, when the epoch has not moved since it was read (read before it, so
    a change committing meanwhile leaves the snapshot behind the epoch: re-read next time) and it
    is younger than `epoch.MAX_AGE_S` (the bound for a lost bump or a per-process cache)."""
    if version is None:
        return None
    with _snapshots_lock:
        held = _snapshots.get(gate_tag(tenant))
    if held is not None and held.version == version and time.monotonic() - held.read_at < epoch.MAX_AGE_S:
        return held
    return None


def read_policies(tenant: Tenant, version: Any) -> Policies:
    """Read the tenant's policies (inside its tenant context) and keep them under `version`."""
    fresh = Policies(
        specs=limit_specs(),
        halts=list(Halt.objects.filter(lifted_at__isnull=True).order_by("created_at", "pk")),
        quarantined=frozenset(
            Quarantine.objects.filter(released_at__isnull=True).values_list("saga_id", flat=True)
        ),
        version=version,
        read_at=time.monotonic(),
    )
    if version is not None:
        with _snapshots_lock:
            _snapshots[gate_tag(tenant)] = fresh
            _snapshots.move_to_end(gate_tag(tenant))
            while len(_snapshots) > SNAPSHOTS_KEPT:
                _snapshots.popitem(last=False)
    return fresh


def governed_tools() -> list[str]:
    """The tool globs some limit applies to (halts and quarantines apply to every call)."""
    globs = set(BudgetLimit.objects.values_list("tool", flat=True))
    globs |= set(RateLimit.objects.values_list("tool", flat=True))
    step = hooks.approval_step()
    if step is not None:
        globs |= set(step.governed_tools())
    return sorted(globs)
