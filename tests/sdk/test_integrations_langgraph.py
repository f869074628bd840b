"""LangGraph through `sagaplane.integrations.langgraph`, against a live control plane: a StateGraph
with a ToolNode and a scripted chat model (no network) calling governed tools. One graph run is
one saga: a call ships its step; a halt and a tool the policy does not name are refused before
the tool; an exception rolls the saga back through the policy's compensation; a pending approval
interrupts the run, and the run resumes in a fresh process from a checkpointer once a person
approved it; a denial reaches the model as the tool's answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command
from sagaplane.integrations import langgraph as splg
from sagaplane.integrations.policy import loads

from approvals.models import ApprovalRequest, Status
from core.scoping import tenant_context
from fleet import services as fleet
from tenants.actors import user_actor
from tests.sdk import lg_agent
from tests.sdk.sagaplane_testkit import read_wal
from tests.support.approvals import Agent, vote
from tests.support.factories import Person
from tests.support.scoping import in_tenant

ROOT = Path(__file__).resolve().parents[2]
# Postgres: the live server's threads and the test's own queries run at once.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "effects.jsonl"
    monkeypatch.setenv("SP_TEST_EFFECTS", str(path))
    return path


@pytest.fixture
def runtime(live_server: Any, key: Agent, tmp_path: Path, effects: Path) -> Iterator[sp.Runtime]:
    runtime = sp.configure(tmp_path / "agent.wal", url=live_server.url, api_key=key.raw_key, agent="lg-bot")
    yield runtime
    sp.shutdown()


def _graph() -> Any:
    return lg_agent.build(splg.govern(lg_agent.TOOLS, policy=loads(lg_agent.POLICY)), InMemorySaver())


def _run(graph: Any, thread: str, turns: list[list[Any]]) -> Any:
    config: Any = {"configurable": {"thread_id": thread}}
    return splg.invoke(graph, {"messages": [HumanMessage(content=json.dumps(turns))]}, config)


def _saga(live_server: Any, key: Agent, saga_id: str) -> dict[str, Any]:
    client = sp.Client(live_server.url, key.raw_key)
    response = client.get(f"/api/v1/sagas/{urllib.parse.quote(saga_id, safe='')}")
    assert response.status == 200, (response.status, response.body)
    return response.body


def _saga_ids(runtime: sp.Runtime) -> list[str]:
    runtime.wal.flush()
    return [r["saga_id"] for r in read_wal(runtime.wal.path) if r["event"] == "SAGA_START"]


def test_a_graph_run_is_one_saga_whose_calls_ship_as_steps(
    live_server: Any, key: Agent, runtime: sp.Runtime
) -> None:
    out = _run(_graph(), "t-ship", [[["search", {"q": "mug"}]], [["charge", {"amount": 5}]]])
    assert out["messages"][-1].content == 'final: {"id": "ch_5"}'
    assert [e["tool"] for e in lg_agent.effects()] == ["search", "charge"]
    assert runtime.flush(30)
    (saga_id,) = set(_saga_ids(runtime))
    held = _saga(live_server, key, saga_id)
    assert held["saga"]["status"] == "completed" and held["saga"]["agent"] == "lg-bot"
    assert [(s["tool"], s["semantics"], s["status"]) for s in held["steps"]] == [
        ("search", "PREVIEW", "committed"),
        ("charge", "COMPENSABLE", "committed"),
    ]
    assert held["steps"][1]["compensation"]["handler"] == "lg-shop:refund"
    intents = [r for r in read_wal(runtime.wal.path) if r["event"] == "STEP_INTENT"]
    assert [r["kwargs"] for r in intents] == [{"q": "mug"}, {"amount": 5}]


def test_a_halt_and_an_unlisted_tool_are_refused_before_the_tool(key: Agent, runtime: sp.Runtime) -> None:
    halt = in_tenant(
        fleet.halt,
        key.tenant,
        fleet.HaltCreate.parse({"scope": "tool:charge", "reason": "card incident"}),
        actor=user_actor("alice"),
    )
    assert runtime.gate is not None
    runtime.gate.refresh()
    try:
        out = _run(_graph(), "t-halt", [[["charge", {"amount": 7}]], [["refund", {"charge_id": "ch_1"}]]])
    finally:
        in_tenant(fleet.resume, key.tenant, halt.pk, actor=user_actor("alice"))
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in answers] == ["error", "error"]
    assert "halted" in answers[0].content and "card incident" in answers[0].content
    assert answers[0].artifact["reason"] == "halted"
    assert answers[1].artifact["reason"] == "not_in_policy" and "not allowed" in answers[1].content
    assert lg_agent.effects() == []  # neither tool ran
    denies = [r["reason"] for r in read_wal(runtime.wal.path) if r["event"] == "GATE_DENY"]
    assert denies == ["halted", "not_in_policy"]


def test_an_exception_rolls_the_saga_back_through_the_policy_compensation(
    live_server: Any, key: Agent, runtime: sp.Runtime
) -> None:
    with pytest.raises(sp.SagaAborted) as aborted:
        _run(_graph(), "t-boom", [[["charge", {"amount": 9}]], [["explode", {"why": "backend down"}]]])
    assert "backend down" in str(aborted.value.cause) and aborted.value.report.clean
    assert [(e["tool"], e["args"]) for e in lg_agent.effects()] == [
        ("charge", {"amount": 9}),
        ("refund", {"charge_id": "ch_9"}),
    ]
    assert runtime.flush(30)
    (saga_id,) = set(_saga_ids(runtime))
    held = _saga(live_server, key, saga_id)
    assert held["saga"]["status"] == "rolled_back"
    assert [(s["tool"], s["status"]) for s in held["steps"]] == [
        ("charge", "compensated"),
        ("explode", "unknown"),
    ]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_denied_approval_reaches_the_model_as_the_tools_answer(
    key: Agent, approver: Person, runtime: sp.Runtime, flavour: str
) -> None:
    graph = _graph()
    config: Any = {"configurable": {"thread_id": "t-deny"}}

    def invoke(given: Any) -> Any:  # the graph run through splg.invoke, or splg.ainvoke (ToolNode awaits)
        if flavour == "sync":
            return splg.invoke(graph, given, config)
        return asyncio.run(splg.ainvoke(graph, given, config))

    turns = [[["wire", {"amount": 900, "to": "acme"}]]]
    out = invoke({"messages": [HumanMessage(content=json.dumps(turns))]})
    (pending,) = out["__interrupt__"]
    assert pending.value["action"] == {"tool": "wire", "arguments": {"amount": 900, "to": "acme"}}
    vote(approver, pending.value["approval_id"], "deny", note="not this supplier")
    out = invoke(Command(resume=True))
    answer = out["messages"][-2]
    assert isinstance(answer, ToolMessage) and answer.status == "error"
    assert "refused" in answer.content and "not this supplier" in answer.content
    assert lg_agent.effects() == []
    # one saga across the interrupt: suspended (a SAGA_START with the approval's lease), resumed, complete
    records = read_wal(runtime.wal.path)
    assert len(set(_saga_ids(runtime))) == 1
    assert [r["event"] for r in records if r["event"] in ("SAGA_START", "SAGA_COMPLETE")] == [
        "SAGA_START",
        "SAGA_START",
        "SAGA_START",
        "SAGA_COMPLETE",
    ]
    suspended = [r for r in records if r["event"] == "SAGA_START" and r.get("suspended")]
    assert len(suspended) == 1 and suspended[0]["lease_ttl"] > splg.DEFAULT_RESUME_GRACE_S


def _agent_process(live_server: Any, key: Agent, tmp_path: Path, *args: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SAGAPLANE_URL": live_server.url,
        "SAGAPLANE_API_KEY": key.raw_key,
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.sdk.lg_agent",
            str(tmp_path / "agent.wal"),
            str(tmp_path / "ckpt"),
            "t-new",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_pending_approval_interrupts_and_the_run_resumes_in_a_fresh_process(
    live_server: Any, key: Agent, approver: Person, tmp_path: Path, effects: Path
) -> None:
    script = json.dumps([[["charge", {"amount": 3}]], [["wire", {"amount": 5000, "to": "acme"}]]])
    first = _agent_process(live_server, key, tmp_path, "start", script)
    (value,) = first["interrupts"]
    assert value["action"] == {"tool": "wire", "arguments": {"amount": 5000, "to": "acme"}}
    assert [e["tool"] for e in lg_agent.effects()] == ["charge"]  # the wire waits
    with tenant_context(key.tenant):
        row = ApprovalRequest.objects.get(pk=value["approval_id"])
    assert row.status == Status.PENDING and row.saga_id == value["saga_id"] and row.tool == "wire"
    voted = approver.session_client().post(
        f"/api/v1/approvals/{row.pk}/votes", {"choice": "approve"}, format="json"
    )  # a person approves through the API
    assert voted.status_code in (200, 201), voted.content

    second = _agent_process(live_server, key, tmp_path, "resume")
    assert second == {"final": "final: sent 5000 to acme"}
    ran = lg_agent.effects()
    assert [e["tool"] for e in ran] == ["charge", "wire"] and ran[0]["pid"] != ran[1]["pid"]
    with tenant_context(key.tenant):
        row.refresh_from_db()
    assert row.status == Status.CONSUMED
    client = sp.Client(live_server.url, key.raw_key)
    held = client.get(f"/api/v1/sagas/{urllib.parse.quote(value['saga_id'], safe='')}").body
    assert held["saga"]["status"] == "completed"
    assert [(s["tool"], s["status"]) for s in held["steps"]] == [
        ("charge", "committed"),
        ("wire", "committed"),
    ]


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # langchain.agents is not installed
def test_a_prebuilt_react_agent_pauses_for_an_approval_and_runs_the_call_once_approved(
    key: Agent, approver: Person, runtime: sp.Runtime
) -> None:
    tools = splg.govern(lg_agent.TOOLS, policy=loads(lg_agent.POLICY))
    graph = create_react_agent(lg_agent.ScriptedModel(), tools, checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-prebuilt"}}
    turns = [[["charge", {"amount": 4}]], [["wire", {"amount": 700, "to": "acme"}]]]
    out = splg.invoke(graph, {"messages": [HumanMessage(content=json.dumps(turns))]}, config)
    (pending,) = out["__interrupt__"]
    assert pending.value["action"]["tool"] == "wire" and [e["tool"] for e in lg_agent.effects()] == ["charge"]
    vote(approver, pending.value["approval_id"])
    out = splg.invoke(graph, Command(resume=True), config)
    assert out["messages"][-1].content == "final: sent 700 to acme"
    assert [e["tool"] for e in lg_agent.effects()] == ["charge", "wire"]  # the charge did not run again
    with tenant_context(key.tenant):
        assert ApprovalRequest.objects.get(pk=pending.value["approval_id"]).status == Status.CONSUMED
    records = read_wal(runtime.wal.path)
    assert [r["tool"] for r in records if r["event"] == "STEP_COMMITTED"] == ["charge", "wire"]
    assert len({r["saga_id"] for r in records if r.get("saga_id")}) == 1
