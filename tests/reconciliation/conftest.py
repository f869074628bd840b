"""Sagas whose steps were compensated, written as the SDK writes them, through the real ingest."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.models import Tenant
from tests.support.chains import Writer


def compensated_saga(
    writer: Writer,
    saga_id: str,
    *,
    charges: list[str] | None = None,
    handler: str | None = "shop.refund",
    failed: bool = False,
) -> list[str]:
    """A checkout whose charges were refunded by its own rollback (the SDK's COMPENSATED records);
    with `failed`, the last refund failed instead. Returns the step ids, in order."""
    charges = charges or ["ch_1"]
    items: list[tuple[str, dict[str, Any]]] = [("SAGA_START", {"saga_id": saga_id, "name": "checkout"})]
    steps = []
    for n, charge in enumerate(charges):
        step_id = f"{saga_id}-s{n}"
        steps.append(step_id)
        base = {"saga_id": saga_id, "step_id": step_id, "tool": "shop.charge"}
        compensation = None
        if handler is not None:
            compensation = {
                "fn": "refund",
                "handler": handler,
                "recoverable": True,
                "description": "",
                "idempotency_key": f"idem-{step_id}",
                "kwargs": {"charge_id": charge},
            }
        items.append(("STEP_INTENT", {**base, "semantics": "COMPENSABLE", "kwargs": {"amount": 42}}))
        items.append(("STEP_COMMITTED", {**base, "semantics": "COMPENSABLE", "compensation": compensation}))
    items.append(("ROLLBACK_START", {"saga_id": saga_id, "steps": len(charges)}))
    for n, step_id in enumerate(reversed(steps)):
        done: dict[str, Any] = {"saga_id": saga_id, "step_id": step_id, "tool": "shop.charge", "attempts": 1}
        if failed and n == 0:
            items.append(("COMPENSATION_FAILED", {**done, "error": "RuntimeError('card network down')"}))
        else:
            items.append(("COMPENSATED", {**done, "idempotency_key": f"idem-{step_id}"}))
    clean = not failed
    items.append(
        (
            "ROLLBACK_END",
            {
                "saga_id": saga_id,
                "clean": clean,
                "compensated": len(charges) - failed,
                "failed": int(failed),
                "orphaned": 0,
                "unresolved": 0,
                "halted": failed,
            },
        )
    )
    items.append(("SAGA_ABORTED", {"saga_id": saga_id, "clean": clean}))
    writer.ship(*items)
    return steps


@pytest.fixture
def no_delay(settings: Any) -> None:
    settings.SAGAPLANE_RECONCILE_DELAY_SECONDS = 0


@pytest.fixture
def agent_a(tenant_a: Tenant) -> Writer:
    return Writer(tenant_a, "agent-a-1")


@pytest.fixture
def agent_b(tenant_b: Tenant) -> Writer:
    return Writer(tenant_b, "agent-b-1")
