"""A LangGraph agent whose tools are governed by Sagaplane: a StateGraph with a ToolNode, a
scripted chat model (no network, no API key: swap in your own model), a tool policy, and a
checkpointer kept in files so a run paused for a person resumes in a new process.

    python sdk/examples/langgraph_agent.py                 # local only: the WAL, no control plane
    SAGAPLANE_URL=http://127.0.0.1:8000 SAGAPLANE_API_KEY=sp_... \
        python sdk/examples/langgraph_agent.py --amount 5000   # with an approval policy on `wire`:
    ...                                                    #   the run pauses (approval id printed)
    SAGAPLANE_URL=... SAGAPLANE_API_KEY=... python sdk/examples/langgraph_agent.py --resume

The agent charges a card (COMPENSABLE: refunded if the run fails), then wires money
(IRREVERSIBLE). `--fail` makes the wire's backend fail: the exception rolls the saga back, so the
charge is refunded. Files go to `--dir` (default ./langgraph-demo).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import sagaplane as sp
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command
from sagaplane.integrations import langgraph as splg

POLICY = """\
name = "demo-shop"
default = "deny"              # a tool this file does not name is refused before it runs

[tools.charge_card]
semantics = "COMPENSABLE"
compensate = { tool = "refund_charge", arguments = { charge_id = "{result.id}" } }
gate_args = { amount = "{args.amount}" }

[tools.wire]
semantics = "IRREVERSIBLE"
"""
FAIL = {"wire": False}


@tool
def charge_card(amount: int) -> str:
    """Charge the customer's card; returns the charge."""
    print(f"  charge_card({amount})")
    return json.dumps({"id": f"ch_{amount}"})


@tool
def refund_charge(charge_id: str) -> str:
    """Refund a charge."""
    print(f"  refund_charge({charge_id})")
    return "refunded"


@tool
def wire(amount: int, to: str) -> str:
    """Wire money to a supplier."""
    if FAIL["wire"]:
        raise ConnectionError("the bank's API is down")
    print(f"  wire({amount}, {to})")
    return f"sent {amount} to {to}"


class ScriptedModel(BaseChatModel):
    """Stands in for a chat model: the human message is a JSON list of turns of tool calls."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        start = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        turns = json.loads(str(messages[start].content))
        done = sum(1 for m in messages[start:] if isinstance(m, AIMessage) and m.tool_calls)
        if done < len(turns):
            calls = [
                {"name": name, "args": args, "id": f"call_{done}_{i}", "type": "tool_call"}
                for i, (name, args) in enumerate(turns[done])
            ]
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="", tool_calls=calls))])
        last = next((m for m in reversed(messages) if isinstance(m, ToolMessage)), None)
        answer = AIMessage(content=f"Done: {last.content if last else 'nothing to do'}")
        return ChatResult(generations=[ChatGeneration(message=answer)])


def build(tools: list[Any], checkpointer: Any) -> Any:
    model = ScriptedModel()
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def file_saver(prefix: Path) -> InMemorySaver:
    """langgraph's in-memory checkpointer kept in files (read at start, written when closed);
    with langgraph-checkpoint-sqlite or -postgres installed, use their savers instead."""
    names = iter(("storage", "writes", "blobs"))

    def factory(*args: Any) -> PersistentDict:
        kept = PersistentDict(*args, filename=f"{prefix}.{next(names)}")
        if os.path.exists(kept.filename):
            kept.load()
        return kept

    return InMemorySaver(factory=factory)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", default="langgraph-demo")
    parser.add_argument("--thread", default="order-42")
    parser.add_argument("--amount", type=int, default=40)
    parser.add_argument("--resume", action="store_true", help="continue a run paused for an approval")
    parser.add_argument("--fail", action="store_true", help="the wire fails: the saga rolls back")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.toml").write_text(POLICY)
    FAIL["wire"] = args.fail
    sp.configure(folder / "agent.wal", agent="langgraph-demo")  # SAGAPLANE_URL / _API_KEY when set
    tools = splg.govern([charge_card, refund_charge, wire], policy=folder / "tools.toml")
    config: Any = {"configurable": {"thread_id": args.thread}}
    script = [[["charge_card", {"amount": args.amount}]], [["wire", {"amount": args.amount, "to": "acme"}]]]
    with file_saver(folder / "checkpoint") as saver:
        graph = build(tools, saver)
        given: Any = Command(resume=True) if args.resume else {"messages": [HumanMessage(json.dumps(script))]}
        try:
            out = splg.invoke(graph, given, config)
        except sp.SagaAborted as aborted:
            print(f"rolled back: {aborted}")
            return
    for paused in out.get("__interrupt__", ()):
        print(f"waiting for approval {paused.value['approval_id']}: {paused.value['action']}")
        print("approve it in the dashboard, then run again with --resume")
        return
    print(out["messages"][-1].content)


if __name__ == "__main__":
    main()
    sp.shutdown()
