"""`sp.tool(..., reason=)`: why the agent makes a call travels with its gate call (issue 29), as
text or computed from the call's arguments, cut to what the server keeps; without one the gate
call's body is unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from sagaplane.context import get_default_gate, set_default_gate
from sagaplane.gate import Call, FleetState, Gate
from sagaplane.steps import REASON_MAX


class Recording(Gate):
    """A gate that has read the fleet's state (the tool is governed) and records what it sends."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "sp_test")
        self.sent: list[dict[str, Any]] = []
        self._state = FleetState(governed_tools=["treasury.*"], read_at=self.clock())

    def _evaluate(self, body: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(body)
        return {"decision": "allow", "authorization_id": "a1"}


@pytest.fixture
def gate(tmp_path: Path) -> Any:
    sp.configure(str(tmp_path / "agent.wal"), agent="treasury-bot", ship=False)
    before = get_default_gate()
    recording = Recording()
    set_default_gate(recording)
    yield recording
    set_default_gate(before)
    sp.shutdown()


def _pay(amount: int, invoice: str) -> dict[str, Any]:
    return {"paid": amount}


@pytest.mark.parametrize(
    ("reason", "sent"),
    [
        ("supplier invoice due today", "supplier invoice due today"),
        (lambda kw: f"invoice {kw['invoice']}", "invoice 2026-114"),
        ("x" * (REASON_MAX + 50), "x" * REASON_MAX),
    ],
)
def test_a_tools_reason_goes_with_its_gate_call(gate: Recording, reason: Any, sent: str) -> None:
    pay = sp.tool(_pay, name="treasury.pay", semantics=sp.REVERSIBLE, reason=reason)
    with sp.saga(name="payout"):
        pay(25000, invoice="2026-114")
    assert [body["reason"] for body in gate.sent] == [sent]


def test_without_a_reason_the_gate_call_is_unchanged(gate: Recording) -> None:
    pay = sp.tool(_pay, name="treasury.pay", semantics=sp.REVERSIBLE)
    with sp.saga(name="payout"):
        pay(25000, invoice="2026-114")
    assert [sorted(body) for body in gate.sent] == [
        ["agent", "args", "saga_id", "semantics", "step_id", "tags", "tool"]
    ]
    assert Call("s", "1", "t", "REVERSIBLE", {}).reason == ""
