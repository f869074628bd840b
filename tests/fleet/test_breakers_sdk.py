"""An agent's SDK and a fleet-wide breaker, against a live control plane: failures another agent
ships open it, and the SDK learns it through its fleet-status long-poll and refuses `circuit_open`
locally (no gate request, within a second or so); half-open, the SDK asks the gate, which lets one
trial through and refuses the next; the trial's success closes it for everyone."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from sagaplane.gate import Call, Gate, GateDenied

from core import epoch
from core.scoping import tenant_context
from fleet import services
from fleet.models import CircuitBreaker, Decision, GateDecision
from tenants.actors import named_actor
from tests.support.chains import Writer
from tests.support.scoping import in_tenant
from tests.support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("database_store")


def refusal(gate: Gate, saga: str) -> str | None:
    try:
        gate.check(Call(saga_id=saga, step_id="1", tool="vendor.pay", semantics="COMPENSABLE", args={}))
    except GateDenied as denied:
        return denied.reason
    return None


def decisions(tenant: Any, saga: str) -> list[tuple[str, str]]:
    with tenant_context(tenant):
        return list(GateDecision.objects.filter(saga_id=saga).values_list("decision", "reason"))


def test_an_open_breaker_reaches_the_sdk_which_refuses_locally_then_one_trial_closes_it(
    transactional_db: None, live_server: Any, alice: Any
) -> None:
    fields = {
        "name": "vendor down",
        "tool": "vendor.*",
        "consecutive_failures": 2,
        "failure_rate": 1,
        "min_volume": 100,
        "window_s": 60,
        "cool_down_s": 60,
    }
    row = in_tenant(
        services.create_breaker, alice.tenant, services.BreakerCreate.parse(fields), actor=named_actor("test")
    )
    gate = Gate(live_server.url, alice.api_key, poll_wait=5).start()
    try:
        assert refusal(gate, "before") is None  # closed: not governed, no request
        writer = Writer(alice.tenant, "other-agent")
        for n in range(2):
            step = {"saga_id": f"failing-{n}", "step_id": "1", "tool": "vendor.pay"}
            writer.ship(("STEP_INTENT", step), ("STEP_FAILED", {**step, "error": "timeout"}))
        opened = time.monotonic()
        wait_until(
            lambda: refusal(gate, "probe") == "circuit_open", "the SDK refusing circuit_open", deadline=10
        )
        print(f"breaker open → SDK refusal after {time.monotonic() - opened:.3f} s")
        assert refusal(gate, "local") == "circuit_open"
        assert decisions(alice.tenant, "local") == []  # refused in the agent: the gate was not asked

        with tenant_context(alice.tenant):  # the cool-down is over
            CircuitBreaker.objects.filter(pk=row.pk).update(opened_at=timezone.now() - timedelta(seconds=61))
        epoch.bump(alice.tenant.pk)
        wait_until(lambda: refusal(gate, "trial") is None, "the trial let through", deadline=10)
        assert decisions(alice.tenant, "trial") == [(Decision.ALLOW, "")]
        assert refusal(gate, "second") == "circuit_open"
        assert decisions(alice.tenant, "second") == [(Decision.DENY, "circuit_open")]  # the gate refused it

        step = {"saga_id": "trial", "step_id": "1", "tool": "vendor.pay"}
        writer.ship(("STEP_COMMITTED", step))
        wait_until(lambda: refusal(gate, "after") is None and not gate.state().breakers, "closed for the SDK")
    finally:
        gate.close()
