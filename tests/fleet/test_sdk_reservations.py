"""The SDK's reserve-then-settle against a live control plane: `sp.tool(..., reserve=)` reserves
the estimate at the gate, `sp.settle(actual)` inside the tool rides the step's record in the WAL
and is settled when the shipper delivers it (the difference returned, an overrun counted), a
reservation the tool never settles is settled at its reserve when the saga's end is shipped, and
the ledger shows reserved, settled and overrun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp

from core.scoping import tenant_context
from fleet import services
from fleet.models import BudgetLimit, GateDecision
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.sdk.sagaplane_testkit import read_wal as read_records
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.usefixtures("database_store")


def test_reserve_then_settle_through_the_wal(
    transactional_db: None, live_server: Any, alice: Any, tmp_path: Path
) -> None:
    tenant: Tenant = alice.tenant
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse(
            {"name": "tokens", "tool": "llm.*", "argument": "tokens", "max_total": 100, "window_s": 3600}
        ),
        actor=named_actor("test"),
    )
    usage = {"tokens": 0}

    def call_model(prompt: str, max_tokens: int, settle: bool = True) -> str:
        if settle:
            sp.settle(usage["tokens"])
        return prompt.upper()[:max_tokens]

    complete = sp.tool(
        call_model, name="llm.complete", semantics=sp.REVERSIBLE, reserve=lambda **kw: kw["max_tokens"]
    )
    wal = tmp_path / "r.wal"
    runtime = sp.configure(wal, url=live_server.url, api_key=alice.api_key, agent="writer")
    try:
        assert runtime.gate is not None
        runtime.gate.refresh()
        with pytest.raises(RuntimeError):
            sp.settle(1)  # outside a step
        sagas = {}
        for name, estimate, actual, settles in [
            ("under", 40, 12, True),
            ("never", 30, 0, False),
            ("over", 20, "50.5", True),
        ]:
            usage["tokens"] = actual
            with sp.saga(name=name) as saga:
                assert complete("hi", max_tokens=estimate, settle=settles) == "HI"
            sagas[name] = saga.saga_id
        # While the last saga runs, 40 + 30 + 20 are reserved: 10 left, an estimate of 11 is refused.
        with pytest.raises(sp.SagaAborted) as refused, sp.saga(name="too-much"):
            complete("no", max_tokens=200)
        assert isinstance(refused.value.cause, sp.GateDenied)
        with pytest.raises(sp.SagaAborted) as hostile, sp.saga(name="hostile"):
            usage["tokens"] = float("nan")
            complete("x", max_tokens=1)
        assert isinstance(hostile.value.cause, ValueError)  # never sent: settled at its reserve
        assert runtime.flush(60), runtime.shipper and runtime.shipper.failure
    finally:
        sp.shutdown()
    records = read_records(wal)
    settled = [r["settle"] for r in records if r["event"] == "STEP_COMMITTED" and r.get("settle")]
    assert [s["actual"] for s in settled] == ["12", "50.5"]
    allows = [r for r in records if r["event"] == "GATE_ALLOW"]
    assert allows[0]["reservation"]["reserved"] == "40"
    with tenant_context(tenant):
        rows = {r.saga_id: r.answer()["reservation"] for r in GateDecision.objects.filter(decision="allow")}
        shown = services.budget_usage(BudgetLimit.objects.get(name="tokens"))[0]
    assert rows[sagas["under"]] | {"id": ""} == {
        "id": "",
        "state": "settled",
        "reserved": "40",
        "actual": "12",
        "overrun": "0",
        "settled_by": "wal",
    }
    assert (rows[sagas["never"]]["actual"], rows[sagas["never"]]["settled_by"]) == ("30", "saga_end")
    assert (rows[sagas["over"]]["actual"], rows[sagas["over"]]["overrun"]) == ("50.5", "30.5")
    # The hostile saga's reservation (1) was settled at its reserve when its abort was shipped.
    assert shown["reserved"] == "0" and shown["overrun"] == "30.5"
    assert shown["used"] == shown["settled"] == "93.5"
