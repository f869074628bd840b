"""The OpenAI Agents SDK through `sagaplane.integrations.openai_agents`, against a live control
plane: an Agent whose Model is a scripted implementation of the SDK's Model interface (no network)
calling governed FunctionTools. One run is one saga: a call ships its step; a pending approval
becomes the SDK's tool-approval interruption and the run resumes from its state once a person
approved in Sagaplane (the call runs once); refusals (a halt, a tool the policy does not name, a
denial) reach the model as the tool's output; an exception rolls the saga back."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from agents import Agent, ModelResponse, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from sagaplane.integrations import openai_agents as spoa
from sagaplane.integrations.policy import loads

from approvals.models import ApprovalRequest, Status
from core.scoping import tenant_context
from fleet import services as fleet
from tenants.actors import user_actor
from tests.sdk.sagaplane_testkit import read_wal
from tests.support.approvals import Agent as KeyHolder
from tests.support.approvals import vote
from tests.support.factories import Person
from tests.support.scoping import in_tenant
from tests.support.threads import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
set_tracing_disabled(True)  # the SDK's own traces would go to OpenAI

POLICY = loads(
    """\
    name = "oa-shop"
    default = "deny"
    [tools.charge]
    semantics = "COMPENSABLE"
    compensate = { tool = "refund", arguments = { charge_id = "{result.id}" } }
    [tools.wire]
    semantics = "IRREVERSIBLE"
    [tools.explode]
    semantics = "PREVIEW"
    """.replace("    ", "")
)
EFFECTS: list[tuple[str, dict[str, Any]]] = []


@function_tool
def charge(amount: int) -> str:
    """Charge the customer's card."""
    EFFECTS.append(("charge", {"amount": amount}))
    return json.dumps({"id": f"ch_{amount}"})


@function_tool
def refund(charge_id: str) -> str:
    """Refund a charge."""
    EFFECTS.append(("refund", {"charge_id": charge_id}))
    return "refunded"


@function_tool
def wire(amount: int, to: str) -> str:
    """Wire money to a supplier."""
    EFFECTS.append(("wire", {"amount": amount, "to": to}))
    return f"sent {amount} to {to}"


@function_tool(failure_error_function=None)
def explode(why: str) -> str:
    """A tool whose backend fails (the failure ends the run)."""
    raise RuntimeError(why)


class ScriptedModel(Model):
    """The user's message is a JSON list of turns, each a list of [tool, arguments] calls; the
    model makes them one turn per answer, then answers with the last tool output."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        script = next(i["content"] for i in items if isinstance(i, dict) and i.get("role") == "user")
        turns = json.loads(script)
        made = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call")
        outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        done, count = 0, 0
        while done < len(turns) and count + len(turns[done]) <= made:
            count += len(turns[done])
            done += 1
        if done < len(turns):
            output: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call",
                    name=name,
                    arguments=json.dumps(args),
                    call_id=f"call_{done}_{i}",
                    id=f"fc_{done}_{i}",
                )
                for i, (name, args) in enumerate(turns[done])
            ]
        else:
            last = outputs[-1]["output"] if outputs else ""
            text = last if isinstance(last, str) else json.dumps(last)
            output = [
                ResponseOutputMessage(
                    id="msg_final",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=f"final: {text}", annotations=[])],
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


@pytest.fixture
def runtime(live_server: Any, key: KeyHolder, tmp_path: Path) -> Iterator[sp.Runtime]:
    EFFECTS.clear()
    runtime = sp.configure(tmp_path / "agent.wal", url=live_server.url, api_key=key.raw_key, agent="oa-bot")
    yield runtime
    sp.shutdown()


def _agent() -> Agent[Any]:
    tools = spoa.govern([charge, refund, wire, explode], policy=POLICY)
    return Agent(name="shop", instructions="Follow the script.", model=ScriptedModel(), tools=tools)


def _events(runtime: sp.Runtime, *names: str) -> list[dict[str, Any]]:
    runtime.wal.flush()
    return [r for r in read_wal(runtime.wal.path) if r["event"] in names]


def _saga(live_server: Any, key: KeyHolder, saga_id: str) -> dict[str, Any]:
    response = sp.Client(live_server.url, key.raw_key).get(
        f"/api/v1/sagas/{urllib.parse.quote(saga_id, safe='')}"
    )
    assert response.status == 200, (response.status, response.body)
    return response.body


def test_a_run_is_one_saga_whose_calls_ship_as_steps(
    live_server: Any, key: KeyHolder, runtime: sp.Runtime
) -> None:
    result = asyncio.run(spoa.run(_agent(), json.dumps([[["charge", {"amount": 5}]]])))
    assert result.final_output == 'final: {"id": "ch_5"}'
    assert EFFECTS == [("charge", {"amount": 5})]
    assert runtime.flush(30)
    (start,) = _events(runtime, "SAGA_START")
    held = _saga(live_server, key, start["saga_id"])
    assert held["saga"]["status"] == "completed"
    assert [(s["tool"], s["status"]) for s in held["steps"]] == [("charge", "committed")]
    assert held["steps"][0]["compensation"]["handler"] == "oa-shop:refund"


def _pending_request(key: KeyHolder) -> ApprovalRequest:
    with tenant_context(key.tenant):
        return ApprovalRequest.objects.get(status=Status.PENDING)


def _approve(key: KeyHolder, approver: Person, choice: str, note: str) -> None:
    """The person's vote (from a thread: the ORM is not called from the event loop)."""
    vote(approver, _pending_request(key).pk, choice, note=note)


def test_an_approval_is_the_sdks_interruption_and_the_run_resumes_once_approved(
    key: KeyHolder, approver: Person, runtime: sp.Runtime
) -> None:
    shop = _agent()

    async def scenario() -> tuple[Any, int, int, Any]:
        first = await spoa.run(shop, json.dumps([[["wire", {"amount": 5000, "to": "acme"}]]]))
        assert len(first.interruptions) == 1 and first.final_output is None
        assert EFFECTS == []
        state = first.to_state()
        before = await spoa.decide(state)  # nobody decided yet
        await in_thread(_approve, key, approver, "approve", "")
        after = await spoa.decide(state, wait=10)
        return await spoa.run(shop, state), before, after, first.interruptions[0]

    result, before, after, item = asyncio.run(scenario())
    assert (before, after) == (1, 0)
    assert item.name == "wire"
    assert result.final_output == "final: sent 5000 to acme"
    assert EFFECTS == [("wire", {"amount": 5000, "to": "acme"})]
    with tenant_context(key.tenant):
        assert ApprovalRequest.objects.get().status == Status.CONSUMED
    # the saga stayed open across the interruption: one start, one end
    assert [r["event"] for r in _events(runtime, "SAGA_START", "SAGA_COMPLETE")] == [
        "SAGA_START",
        "SAGA_COMPLETE",
    ]
    (allow,) = _events(runtime, "GATE_ALLOW")
    assert allow["tool"] == "wire" and allow["approvals"]


def test_refusals_reach_the_model_as_the_tools_output(
    key: KeyHolder, approver: Person, runtime: sp.Runtime
) -> None:
    shop = _agent()
    halt = in_tenant(
        fleet.halt,
        key.tenant,
        fleet.HaltCreate.parse({"scope": "tool:charge", "reason": "card incident"}),
        actor=user_actor("alice"),
    )
    assert runtime.gate is not None
    runtime.gate.refresh()
    try:
        halted = asyncio.run(spoa.run(shop, json.dumps([[["charge", {"amount": 7}]]])))
        unlisted = asyncio.run(spoa.run(shop, json.dumps([[["refund", {"charge_id": "ch_1"}]]])))
    finally:
        in_tenant(fleet.resume, key.tenant, halt.pk, actor=user_actor("alice"))
    assert "halted" in halted.final_output and "card incident" in halted.final_output
    assert "not allowed" in unlisted.final_output

    async def denied() -> Any:
        first = await spoa.run(shop, json.dumps([[["wire", {"amount": 800, "to": "acme"}]]]))
        await in_thread(_approve, key, approver, "deny", "not this supplier")
        state = first.to_state()
        assert await spoa.decide(state, wait=10) == 0
        return await spoa.run(shop, state)

    result = asyncio.run(denied())
    assert "refused" in result.final_output and "not this supplier" in result.final_output
    assert EFFECTS == []
    assert [r["reason"] for r in _events(runtime, "GATE_DENY")] == ["halted", "not_in_policy"]


def test_an_exception_rolls_the_run_back(runtime: sp.Runtime) -> None:
    script = json.dumps([[["charge", {"amount": 9}]], [["explode", {"why": "backend down"}]]])
    with pytest.raises(sp.SagaAborted) as aborted:
        asyncio.run(spoa.run(_agent(), script))
    assert "backend down" in str(aborted.value.cause) and aborted.value.report.clean
    assert EFFECTS == [("charge", {"amount": 9}), ("refund", {"charge_id": "ch_9"})]
    assert [r["event"] for r in _events(runtime, "COMPENSATED", "SAGA_ABORTED")] == [
        "COMPENSATED",
        "SAGA_ABORTED",
    ]
