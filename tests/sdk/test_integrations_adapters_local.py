"""The adapters without a control plane (local WAL only): a governed tool called outside a governed
run is a saga of its own, completed at once; a tool the policy does not name is refused with a
sentence and never runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sagaplane as sp
from agents import function_tool
from agents.tool_context import ToolContext
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from sagaplane.integrations import langgraph as splg
from sagaplane.integrations import openai_agents as spoa
from sagaplane.integrations.policy import loads
from sagaplane_testkit import read_wal

POLICY = loads('name = "local-shop"\ndefault = "deny"\n[tools.lookup]\nsemantics = "PREVIEW"\n')
RAN: list[str] = []


@tool("lookup")
def lc_lookup(sku: str) -> str:
    """Look a product up."""
    RAN.append(f"lookup {sku}")
    return "found"


@tool("erase")
def lc_erase(sku: str) -> str:
    """Erase a product."""
    RAN.append(f"erase {sku}")
    return "erased"


@function_tool(name_override="lookup")
def oa_lookup(sku: str) -> str:
    """Look a product up."""
    RAN.append(f"lookup {sku}")
    return "found"


@function_tool(name_override="erase")
def oa_erase(sku: str) -> str:
    """Erase a product."""
    RAN.append(f"erase {sku}")
    return "erased"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[sp.Runtime]:
    RAN.clear()
    runtime = sp.configure(tmp_path / "local.wal", ship=False, gate=False)
    yield runtime
    sp.shutdown()


def _sagas(runtime: sp.Runtime) -> list[tuple[str, str]]:
    runtime.wal.flush()
    return [(r["event"], r["saga_id"]) for r in read_wal(runtime.wal.path) if r["event"].startswith("SAGA_")]


def test_a_langchain_tool_outside_a_governed_run_is_a_saga_of_its_own(runtime: sp.Runtime) -> None:
    lookup, erase = splg.govern([lc_lookup, lc_erase], policy=POLICY)
    assert lookup.invoke({"sku": "mug"}) == "found"
    call = {"name": "lookup", "args": {"sku": "cup"}, "id": "call_1", "type": "tool_call"}
    answer = lookup.invoke(call)
    assert isinstance(answer, ToolMessage) and answer.content == "found" and answer.tool_call_id == "call_1"
    refused = erase.invoke({"name": "erase", "args": {"sku": "mug"}, "id": "call_2", "type": "tool_call"})
    assert refused.status == "error" and "not allowed" in refused.content
    assert refused.artifact["reason"] == "not_in_policy"
    assert RAN == ["lookup mug", "lookup cup"]
    events = _sagas(runtime)
    assert [e for e, _ in events] == ["SAGA_START", "SAGA_COMPLETE"] * 3
    assert len({s for _, s in events}) == 3


def test_a_function_tool_outside_a_governed_run_is_a_saga_of_its_own(runtime: sp.Runtime) -> None:
    lookup, erase = spoa.govern([oa_lookup, oa_erase], policy=POLICY)

    async def call(target: Any, call_id: str) -> Any:
        text = json.dumps({"sku": "mug"})
        context = ToolContext(None, tool_name=target.name, tool_call_id=call_id, tool_arguments=text)
        assert not await target.needs_approval(context, {"sku": "mug"}, call_id)  # no run: nothing to pause
        return await target.on_invoke_tool(context, text)

    assert asyncio.run(call(lookup, "c1")) == "found"
    refused = asyncio.run(call(erase, "c2"))
    assert "not allowed" in refused and RAN == ["lookup mug"]
    assert [e for e, _ in _sagas(runtime)] == ["SAGA_START", "SAGA_COMPLETE"] * 2
