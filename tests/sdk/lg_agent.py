"""A LangGraph agent for the adapter tests, also run as a process of its own: a scripted chat model
(no network: the human message is a JSON list of turns, each a list of [tool, arguments] calls),
tools that record their effects in a file, and a checkpointer kept in files (langgraph's
PersistentDict), so a run interrupted in one process is resumed in another.

    python -m tests.sdk.lg_agent WAL CHECKPOINT THREAD start '[[["wire", {...}]]]'
    python -m tests.sdk.lg_agent WAL CHECKPOINT THREAD resume
prints one JSON line: {"interrupts": [...]} | {"final": "..."} | {"aborted": "..."}."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

POLICY = """\
name = "lg-shop"
default = "deny"

[tools.search]
semantics = "PREVIEW"

[tools.charge]
semantics = "COMPENSABLE"
compensate = { tool = "refund", arguments = { charge_id = "{result.id}" } }

[tools.wire]
semantics = "IRREVERSIBLE"

[tools.explode]
semantics = "PREVIEW"
"""


def effects_path() -> Path:
    return Path(os.environ["SP_TEST_EFFECTS"])


def record(tool_name: str, arguments: dict[str, Any]) -> None:
    with effects_path().open("a") as out:
        out.write(json.dumps({"tool": tool_name, "args": arguments, "pid": os.getpid()}) + "\n")


def effects() -> list[dict[str, Any]]:
    path = effects_path()
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@tool
def search(q: str) -> str:
    """Search the catalogue."""
    record("search", {"q": q})
    return json.dumps({"hits": [q]})


@tool
def charge(amount: int) -> str:
    """Charge the customer's card."""
    record("charge", {"amount": amount})
    return json.dumps({"id": f"ch_{amount}"})


@tool
def refund(charge_id: str) -> str:
    """Refund a charge."""
    record("refund", {"charge_id": charge_id})
    return "refunded"


@tool
def wire(amount: int, to: str) -> str:
    """Wire money to a supplier."""
    record("wire", {"amount": amount, "to": to})
    return f"sent {amount} to {to}"


@tool
def explode(why: str) -> str:
    """A tool whose backend fails."""
    raise RuntimeError(why)


TOOLS: list[BaseTool] = [search, charge, refund, wire, explode]


class ScriptedModel(BaseChatModel):
    """Emits the tool calls the last human message scripts, one turn per answer, then a final
    answer quoting the last tool result. Stateless: the messages say which turn is next."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self  # the script names the tools; what the prebuilt agent binds changes nothing

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        script = str(messages[last_human].content)
        turns = json.loads(script)
        done = sum(1 for m in messages[last_human:] if isinstance(m, AIMessage) and m.tool_calls)
        if done < len(turns):
            tag = hashlib.sha256(script.encode()).hexdigest()[:8]
            calls = [
                {"name": name, "args": args, "id": f"call_{tag}_{done}_{i}", "type": "tool_call"}
                for i, (name, args) in enumerate(turns[done])
            ]
            message = AIMessage(content="", tool_calls=calls)
        else:
            results = [m for m in messages if isinstance(m, ToolMessage)]
            message = AIMessage(content="final: " + (str(results[-1].content) if results else ""))
        return ChatResult(generations=[ChatGeneration(message=message)])


def build(tools: list[BaseTool], checkpointer: Any) -> Any:
    model = ScriptedModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def file_saver(path: Path) -> InMemorySaver:
    """A checkpointer in three files beside `path`, read at start, written when it is closed."""
    names: Iterator[str] = iter(("storage", "writes", "blobs"))

    def factory(*args: Any) -> PersistentDict:
        kept = PersistentDict(*args, filename=f"{path}.{next(names)}")
        if os.path.exists(kept.filename):
            kept.load()
        return kept

    return InMemorySaver(factory=factory)


def outcome(out: Any) -> dict[str, Any]:
    interrupts = out.get("__interrupt__") if isinstance(out, dict) else None
    if interrupts:
        return {"interrupts": [i.value for i in interrupts]}
    return {"final": str(out["messages"][-1].content)}


def main(argv: list[str]) -> None:
    import sagaplane as sp
    from langgraph.types import Command
    from sagaplane.integrations import langgraph as splg
    from sagaplane.integrations.policy import loads

    wal, checkpoint, thread, mode = argv[:4]
    sp.configure(wal, agent="lg-bot")
    tools = splg.govern(TOOLS, policy=loads(POLICY))
    config: Any = {"configurable": {"thread_id": thread}}
    with file_saver(Path(checkpoint)) as saver:
        graph = build(tools, saver)
        given = HumanMessage(content=argv[4]) if mode == "start" else Command(resume={"decided": True})
        try:
            out = splg.invoke(graph, {"messages": [given]} if mode == "start" else given, config)
            answer = outcome(out)
        except sp.SagaAborted as aborted:
            answer = {"aborted": str(aborted.cause), "clean": aborted.report.clean}
    sp.get_runtime().flush(30)  # type: ignore[union-attr]
    print(json.dumps(answer), flush=True)
    sp.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
