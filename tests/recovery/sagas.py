"""Crashed sagas for the recovery tests: real chained records through the real ingest."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from core.scoping import tenant_context
from recovery.models import Job, Lease
from recovery.tasks import sweep_tenant
from sagas.models import Saga
from tenants.models import Tenant
from tests.support.chains import Writer

HANDLER = "shop.refund"


def step_fields(
    saga_id: str, n: int, *, semantics: str = "COMPENSABLE", handler: str | None = HANDLER
) -> dict[str, Any]:
    return {"saga_id": saga_id, "step_id": f"{saga_id}-s{n}", "tool": "shop.charge", "semantics": semantics}


def compensation(saga_id: str, n: int, handler: str | None = HANDLER) -> dict[str, Any] | None:
    if handler is None:
        return None
    return {
        "fn": "refund",
        "handler": handler,
        "recoverable": True,
        "description": "refund",
        "idempotency_key": f"idem-{saga_id}-{n}",
        "kwargs": {"charge_id": f"ch-{saga_id}-{n}"},
    }


def crashed(
    writer: Writer,
    saga_id: str,
    *,
    steps: int = 3,
    lease_ttl: float = 0.05,
    semantics: str = "COMPENSABLE",
    handler: str | None = HANDLER,
    last: str = "STEP_COMMITTED",
    end: str | None = None,
) -> None:
    """SAGA_START, then `steps` charges committed (the last one ending with `last`), no terminal
    record unless `end`."""
    items: list[tuple[str, dict[str, Any]]] = [("SAGA_START", {"saga_id": saga_id, "lease_ttl": lease_ttl})]
    for n in range(1, steps + 1):
        fields = step_fields(saga_id, n, semantics=semantics)
        items.append(("STEP_INTENT", fields))
        outcome = last if n == steps else "STEP_COMMITTED"
        if outcome == "STEP_INTENT":
            continue
        items.append((outcome, {**fields, "compensation": compensation(saga_id, n, handler)}))
    if end:
        items.append((end, {"saga_id": saga_id}))
    writer.ship(*items)


def sweep_later(tenant: Tenant, seconds: float = 5.0) -> dict[str, int]:
    """A sweep as the beat would run it `seconds` from now (every lease in these tests is shorter)."""
    return sweep_tenant(tenant, now=timezone.now() + timedelta(seconds=seconds))


def expire(tenant: Tenant, saga_id: str, ago: float = 60.0) -> None:
    """The agent's lease ran out `ago` seconds ago (as if that much time had passed)."""
    when = timezone.now() - timedelta(seconds=ago)
    with tenant_context(tenant):
        Lease.objects.filter(saga_id=saga_id).update(expires_at=when)
        Saga.objects.filter(saga_id=saga_id).update(lease_expires_at=when)


def escalated_job(tenant: Tenant) -> Any:
    """An escalated recovery job of acme's: a crashed saga whose only step has no handler."""
    writer = Writer(tenant, "agent-acme-crashed")
    step = {"saga_id": "acme-crashed", "step_id": "s1", "tool": "shop.charge", "semantics": "COMPENSABLE"}
    writer.ship(
        ("SAGA_START", {"saga_id": "acme-crashed", "lease_ttl": 0.001}),
        ("STEP_INTENT", step),
        ("STEP_COMMITTED", {**step, "compensation": None}),
    )
    sweep_tenant(tenant, now=timezone.now() + timedelta(seconds=1))
    with tenant_context(tenant):
        return Job.objects.get(saga_id="acme-crashed")
