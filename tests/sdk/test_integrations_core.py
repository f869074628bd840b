"""The governed call: a policy-named tool call becomes a saga step through the SDK's own step
machinery (gate, intent before the effect, outcome, a registered compensation with JSON
arguments), refusals never reach the tool, and each call is an OpenTelemetry span."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sagaplane import tracing
from sagaplane.gate import ApprovalPending, Call, GateDenied, approval_listener, wait_for_approvals
from sagaplane.integrations import core, policy
from sagaplane.saga import set_default_gate
from sagaplane_testkit import read_wal

from tests.support.waiting import wait_until_async

POLICY = policy.loads(
    textwrap.dedent(
        """\
        name = "unit-shop"
        [tools.search]
        semantics = "PREVIEW"
        [tools.charge]
        semantics = "COMPENSABLE"
        compensate = { tool = "refund", arguments = { charge_id = "{result.id}", amount = "{args.amount}" } }
        gate_args = { amount = "{args.order.total}" }
        [tools.set_email]
        semantics = "REVERSIBLE"
        capture = { tool = "get_email", arguments = { user = "{args.user}" } }
        compensate = { tool = "set_email", arguments = { user = "{args.user}", email = "{state.email}" } }
        [tools.validate]
        semantics = "COMPENSABLE"
        on_error = "not_applied"
        compensate = { tool = "refund", arguments = { charge_id = "{args.id}" } }
        [tools.wire]
        semantics = "IRREVERSIBLE"
        """
    )
)


class FakeGate:
    """The gate's interface (`check`), scripted: answers, refusals, an approval wait."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.deny: dict[str, GateDenied] = {}
        self.pending_for: set[str] = set()

    def check(self, call: Call) -> dict[str, Any] | None:
        self.calls.append(call)
        if call.tool in self.pending_for and not wait_for_approvals.get():
            raise ApprovalPending({"decision": "pending_approval", "approval_id": "ap1", "expires_in": 60})
        if call.tool in self.pending_for:
            listener = approval_listener.get()
            assert listener is not None
            listener({"approval_id": "ap1", "expires_in": 60}, 59.5)
        if call.tool in self.deny:
            raise self.deny[call.tool]
        return {"decision": "allow", "authorization_id": "auth-1"}


@pytest.fixture
def gate() -> Iterator[FakeGate]:
    fake = FakeGate()
    set_default_gate(fake)  # type: ignore[arg-type]
    yield fake
    set_default_gate(None)


@pytest.fixture
def world() -> dict[str, Any]:
    """What the fake tool source did, in order."""
    return {"calls": [], "emails": {"ann": "ann@old.example"}}


@pytest.fixture
def governor(world: dict[str, Any]) -> core.Governor:
    async def run_tool(tool: str, arguments: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        world["calls"].append((tool, arguments, key))
        if tool == "get_email":
            return {"email": world["emails"][arguments["user"]]}
        if tool == "set_email":
            world["emails"][arguments["user"]] = arguments["email"]
        return {"ok": True}

    core.register_compensators(POLICY, run_tool)
    return core.Governor(
        POLICY, is_error=lambda r: isinstance(r, dict) and r.get("error") is True, capture=run_tool
    )


def test_a_compensable_call_is_a_step_whose_compensation_is_a_registered_handler(
    tmp_path: Path, gate: FakeGate, governor: core.Governor
) -> None:
    wal = sp.WAL(tmp_path / "a.wal")
    seen_before_effect: list[str] = []

    def charge() -> dict[str, Any]:
        wal.flush()
        seen_before_effect.extend(r["event"] for r in read_wal(wal.path))
        return {"id": "ch_9"}

    async def run() -> Any:
        async with sp.saga(name="unit", wal=wal) as saga:
            return await governor.call(
                saga, "charge", {"amount": 5, "order": {"total": 7}}, charge, call_id="c1"
            )

    assert asyncio.run(run()) == {"id": "ch_9"}
    wal.close()
    assert "STEP_INTENT" in seen_before_effect and "STEP_COMMITTED" not in seen_before_effect
    records = read_wal(wal.path)
    intent = next(r for r in records if r["event"] == "STEP_INTENT")
    assert intent["tool"] == "charge" and intent["kwargs"] == {"amount": 5, "order": {"total": 7}}
    committed = next(r for r in records if r["event"] == "STEP_COMMITTED")
    comp = committed["compensation"]
    assert comp["handler"] == "unit-shop:refund" and comp["recoverable"] is True
    assert comp["kwargs"] == {"arguments": {"charge_id": "ch_9", "amount": 5}}
    # gate_args: the gate read the mapped amount beside the call's own arguments
    (call,) = gate.calls
    assert call.args == {"amount": 7, "order": {"total": 7}}


def test_rollback_runs_the_policy_compensations_newest_first_with_captured_state(
    tmp_path: Path, gate: FakeGate, governor: core.Governor, world: dict[str, Any]
) -> None:
    wal = sp.WAL(tmp_path / "b.wal")

    async def run() -> None:
        async with sp.saga(name="unit", wal=wal) as saga:
            await governor.call(saga, "charge", {"amount": 1, "order": {"total": 1}}, lambda: {"id": "ch_1"})

            async def set_new() -> dict[str, Any]:
                world["emails"]["ann"] = "ann@new.example"
                return {"ok": True}

            await governor.call(saga, "set_email", {"user": "ann", "email": "ann@new.example"}, set_new)
            raise RuntimeError("the agent changed its mind")

    with pytest.raises(sp.SagaAborted):
        asyncio.run(run())
    wal.close()
    tools = [c[0] for c in world["calls"]]
    assert tools == ["get_email", "set_email", "refund"]  # capture, then LIFO compensations
    assert world["emails"]["ann"] == "ann@old.example"
    assert world["calls"][2][1] == {"charge_id": "ch_1", "amount": 1}
    assert world["calls"][2][2] == sp.idempotency_key(
        next(r["saga_id"] for r in read_wal(wal.path) if r["event"] == "SAGA_START"),
        next(r["step_id"] for r in read_wal(wal.path) if r["event"] == "STEP_INTENT"),
    )


def test_refusals_never_reach_the_tool(tmp_path: Path, gate: FakeGate, governor: core.Governor) -> None:
    wal = sp.WAL(tmp_path / "c.wal")
    gate.deny["search"] = GateDenied("halted", {"scope": "tool:search", "halt_reason": "incident 42"})
    ran: list[str] = []

    def never() -> None:
        ran.append("ran")

    with sp.saga(name="unit", wal=wal) as saga:
        with pytest.raises(core.Refused) as unlisted:
            governor.call_sync(saga, "format_disk", {}, never)
        with pytest.raises(core.Refused) as halted:
            governor.call_sync(saga, "search", {"q": "x"}, never)
        with pytest.raises(core.Refused) as unresolved:
            governor.call_sync(saga, "charge", {"amount": 1}, never)  # gate_args needs order.total
    wal.close()
    assert ran == []
    assert unlisted.value.reason == "not_in_policy" and "not allowed" in unlisted.value.message
    assert halted.value.reason == "halted" and "incident 42" in halted.value.message
    assert halted.value.payload()["halt_reason"] == "incident 42"
    assert unresolved.value.reason == "arguments_unresolved"
    denies = [r["reason"] for r in read_wal(wal.path) if r["event"] == "GATE_DENY"]
    assert denies == ["not_in_policy", "halted"]
    assert not any(r["event"] == "STEP_INTENT" for r in read_wal(wal.path))


def test_tool_errors_are_returned_and_recorded_by_the_rule(
    tmp_path: Path, gate: FakeGate, governor: core.Governor
) -> None:
    wal = sp.WAL(tmp_path / "d.wal")
    failed = {"error": True, "text": "card declined"}
    with sp.saga(name="unit", wal=wal) as saga:
        assert (
            governor.call_sync(saga, "charge", {"amount": 1, "order": {"total": 1}}, lambda: failed) == failed
        )
        assert governor.call_sync(saga, "validate", {"id": "x"}, lambda: failed) == failed
    wal.close()
    outcomes = [
        r["event"]
        for r in read_wal(wal.path)
        if r["event"].startswith("STEP_") and r["event"] != "STEP_INTENT"
    ]
    assert outcomes == ["STEP_UNKNOWN", "STEP_FAILED"]


def test_a_pending_approval_is_reported_while_the_gate_waits(
    tmp_path: Path, gate: FakeGate, governor: core.Governor
) -> None:
    gate.pending_for.add("wire")
    wal = sp.WAL(tmp_path / "e.wal")
    pending: list[dict[str, Any]] = []

    async def note(info: dict[str, Any]) -> None:
        pending.append(info)

    async def run() -> Any:
        async with sp.saga(name="unit", wal=wal) as saga:
            out = await governor.call(saga, "wire", {"to": "x"}, lambda: "sent", on_pending=note)
            # The notification is scheduled on this loop from the gate's thread.
            await wait_until_async(lambda: pending, "the pending approval's notification", every=0.01)
            return out

    assert asyncio.run(run()) == "sent"  # IRREVERSIBLE: the policy file confirms it
    wal.close()
    assert pending == [{"tool": "wire", "approval_id": "ap1", "expires_in": 60, "seconds_left": 59.5}]


def test_each_governed_call_is_an_execute_tool_span_only_with_a_tracer_provider(
    tmp_path: Path, gate: FakeGate, governor: core.Governor, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = sp.WAL(tmp_path / "f.wal")
    with sp.saga(name="unit", wal=wal) as saga:  # no provider configured: nothing is recorded
        governor.call_sync(saga, "search", {"q": "a"}, lambda: "r")
    assert tracing.tool_span("t", "c", "s", "st", "PREVIEW") is None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert tracing._trace is not None
    monkeypatch.setattr(tracing._trace, "get_tracer", lambda name, *a, **k: provider.get_tracer(name))
    gate.deny["wire"] = GateDenied("budget_exceeded", {"limit": "daily"})
    with sp.saga(name="unit", wal=wal) as saga:
        governor.call_sync(saga, "search", {"q": "a"}, lambda: "r", call_id="call_7")
        with pytest.raises(core.Refused):
            governor.call_sync(saga, "wire", {"to": "x"}, lambda: "never")
    wal.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    search = spans["execute_tool search"].attributes or {}
    assert search["gen_ai.operation.name"] == "execute_tool" and search["gen_ai.tool.name"] == "search"
    assert search["gen_ai.tool.call.id"] == "call_7" and search["sagaplane.saga_id"] == saga.saga_id
    assert search["sagaplane.gate.decision"] == "allow" and search["sagaplane.step.state"] == "COMMITTED"
    wire = spans["execute_tool wire"]
    assert (wire.attributes or {})["sagaplane.gate.decision"] == "deny:budget_exceeded"
    assert wire.status.status_code.name == "ERROR"


def test_without_waiting_a_pending_approval_is_pending_and_the_same_step_is_asked_again(
    tmp_path: Path, gate: FakeGate, governor: core.Governor
) -> None:
    """For frameworks that pause themselves: nothing runs or is recorded while the approval is
    pending; the re-run of the same tool call is the same step to the gate (its id from the call)."""
    gate.pending_for.add("wire")
    wal = sp.WAL(tmp_path / "g.wal")
    ran: list[str] = []

    async def run() -> tuple[Any, Any, Any]:
        async with sp.saga(name="unit", wal=wal) as saga:
            step_id = core.step_id_for(saga.saga_id, "call_9")
            asked = await governor.preflight(saga, "wire", {"to": "x"}, step_id=step_id)
            with pytest.raises(core.Pending) as held:
                await governor.call(
                    saga,
                    "wire",
                    {"to": "x"},
                    lambda: ran.append("wire"),
                    call_id="call_9",
                    step_id=step_id,
                    wait=False,
                )
            gate.pending_for.clear()  # a person approved it
            done = await governor.call(
                saga,
                "wire",
                {"to": "x"},
                lambda: ran.append("wire") or "sent",
                call_id="call_9",
                step_id=step_id,
                wait=False,
            )
            return asked, held.value, done

    asked, held, done = asyncio.run(run())
    wal.close()
    assert isinstance(asked, core.Pending) and asked.approval_id == "ap1"
    assert (
        held.payload()["action"] == {"tool": "wire", "arguments": {"to": "x"}}
        and held.step_id == asked.step_id
    )
    assert done == "sent" and ran == ["wire"]
    assert len({c.step_id for c in gate.calls}) == 1 and len(gate.calls) == 3
    assert (
        core.step_id_for("s", "call_9") == core.step_id_for("s", "call_9") != core.step_id_for("s", "call_8")
    )
    records = read_wal(wal.path)
    assert [r["step_id"] for r in records if r["event"] == "STEP_INTENT"] == [held.step_id]
    assert not any(r["event"] == "GATE_DENY" for r in records)


def test_a_suspended_saga_is_resumed_from_its_journal_and_rolls_back_its_steps(
    tmp_path: Path, gate: FakeGate, governor: core.Governor, world: dict[str, Any]
) -> None:
    wal = sp.WAL(tmp_path / "h.wal")
    saga = sp.Saga(name="paused", wal=wal)
    with saga:
        governor.call_sync(saga, "charge", {"amount": 2, "order": {"total": 2}}, lambda: {"id": "ch_2"})
        journal = saga.suspend(600.0)
    assert saga.status == "suspended"  # leaving the block wrote no end: whoever resumes it does
    with (
        pytest.raises(sp.SagaAborted) as aborted,
        sp.Saga.resume(saga.saga_id, journal, name="paused", wal=wal),
    ):
        raise RuntimeError("changed its mind after the approval")
    wal.close()
    assert aborted.value.report.clean and [s.tool for s in aborted.value.report.compensated] == ["charge"]
    assert world["calls"][-1][:2] == ("refund", {"charge_id": "ch_2", "amount": 2})
    starts = [r for r in read_wal(wal.path) if r["event"] == "SAGA_START"]
    assert [(r["saga_id"], r.get("suspended"), r["lease_ttl"]) for r in starts] == [
        (saga.saga_id, None, 30.0),
        (saga.saga_id, True, 600.0),
        (saga.saga_id, None, 30.0),
    ]
