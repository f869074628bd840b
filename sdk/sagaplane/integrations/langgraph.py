"""LangGraph: LangChain tools governed by a tool policy, for `ToolNode` and the prebuilt agents.

    from sagaplane.integrations import langgraph as splg

    tools = splg.govern([search, charge_card, refund_charge], policy="tools.toml")
    graph = builder.compile(checkpointer=saver)          # a StateGraph with ToolNode(tools)
    config = {"configurable": {"thread_id": "order-42"}}
    out = splg.invoke(graph, {"messages": [...]}, config)  # one graph run: one saga
    for pending in out.get("__interrupt__", ()):          # an approval is pending
        pending.value["approval_id"], pending.value["action"]
    ...                                                   # a person decides in Sagaplane, then
    out = splg.invoke(graph, Command(resume=True), config)   # here or in a new process

Each call of a governed tool is a step of the run's saga (`integrations.core.Governor`): the gate
first (halts, budgets, rate limits, approvals), the intent in the WAL, the call, its outcome; the
policy's compensation is a registered compensator. A refused call never reaches the tool: the
model gets a `ToolMessage` (status "error") whose content is a sentence it can act on and whose
artifact is the refusal as data.

A pending approval raises LangGraph's `interrupt()` with the approval id and the action; the run
returns (its `__interrupt__`) and the saga is *suspended* (`Saga.suspend`): this process stops
renewing its lease, which now lasts until the approval's deadline plus `resume_grace`. Resuming the
thread with `Command(resume=...)` (any value: Sagaplane's decision is what counts) continues the
same saga, in this process or another one reading the same checkpointer: the interrupt's value
carries the saga id and its journal (the steps and their compensations). On resume the call is
asked again with the same step id (derived from the model's tool call id): approved, it runs once;
denied or expired, the model gets the refusal; still pending, the run interrupts again.

`invoke` / `ainvoke` bound the saga: the graph finishing completes it; an exception out of the
graph rolls it back (newest step first) and is raised as `sagaplane.SagaAborted`. A governed
tool called outside them (plain `graph.invoke`, or the tool invoked directly) is a saga of its
own, and waits for a pending approval instead of interrupting.

Configuration: `sagaplane.configure(...)`, or, when nothing configured the SDK, the environment
(SAGAPLANE_URL, SAGAPLANE_API_KEY, SAGAPLANE_AGENT, SAGAPLANE_WAL) read at the first call.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from langgraph.types import interrupt
from pydantic import ConfigDict

from ..context import run_coro
from ..runtime import configure, get_runtime
from ..saga import Saga
from . import core
from .policy import Policy, load

MARK = "sagaplane"  # the key of an interrupt value this module raised
DEFAULT_RESUME_GRACE_S = 3600.0  # after an approval's deadline, how long a suspended saga waits
DEFAULT_SUSPEND_TTL_S = 24 * 3600.0  # a run paused by someone else's interrupt


def govern(tools: Sequence[BaseTool], *, policy: str | Path | Policy) -> list[BaseTool]:
    """The tools governed by the policy (same names, descriptions and argument schemas). The
    policy's compensations and captures call tools of this list by name (ungoverned)."""
    rules = policy if isinstance(policy, Policy) else load(policy)
    by_name = {t.name: t for t in tools}

    def run_tool(name: str, arguments: dict[str, Any], idempotency_key: str | None = None) -> Any:
        target = by_name.get(name)
        if target is None:
            raise LookupError(f"the policy {rules.name!r} calls {name!r}, which is not among the tools")
        out = _invoke_plain(target, arguments)
        if _is_error(out):
            raise RuntimeError(f"{name} answered with an error: {_content(out)[:500]}")
        return out

    core.register_compensators(rules, run_tool)
    governor = core.Governor(rules, view_result=_view, is_error=_is_error, capture=run_tool)
    return [GovernedTool.wrap(t, governor) for t in tools]


def _invoke_plain(target: BaseTool, arguments: dict[str, Any]) -> Any:
    try:
        return target.invoke(arguments)
    except NotImplementedError:  # an async-only tool
        return run_coro(target.ainvoke(arguments))


# -- results as the policy's templates read them ------------------------------------------------


def _content(out: Any) -> str:
    content = out.content if isinstance(out, ToolMessage) else out
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _view(out: Any) -> Any:
    """`{result.…}`: a ToolMessage's artifact when it has one, else its content (JSON-decoded when
    it is JSON text); a plain result as it is."""
    if isinstance(out, ToolMessage):
        if out.artifact is not None:
            return out.artifact
        out = out.content
    if isinstance(out, str):
        try:
            return json.loads(out)
        except ValueError:
            return out
    return out


def _is_error(out: Any) -> bool:
    return isinstance(out, ToolMessage) and out.status == "error"


# -- the run: one saga per graph run (thread) ---------------------------------------------------


@dataclass
class _Run:
    saga: Saga
    outputs: dict[str, Any] = field(default_factory=dict)  # step id -> what the call returned


_runs: dict[str, _Run] = {}
_suspended: dict[str, dict[str, Any]] = {}  # thread -> {"saga_id", "name", "journal", "outputs"}
_lock = threading.Lock()


def _thread_of(config: RunnableConfig | None) -> str:
    thread = (config or {}).get("configurable", {}).get("thread_id")
    return "" if thread is None else str(thread)


def _ensure_runtime() -> None:
    if get_runtime() is None:
        configure()


def _journal_from(interrupts: Iterable[Any]) -> dict[str, Any] | None:
    for item in interrupts:
        value = getattr(item, "value", None)
        if isinstance(value, dict) and isinstance(value.get(MARK), dict):
            return dict(value[MARK])
    return None


def _deadline(interrupts: Iterable[Any]) -> float | None:
    lefts = [
        float(item.value["expires_in"])
        for item in interrupts
        if isinstance(getattr(item, "value", None), dict)
        and MARK in item.value
        and isinstance(item.value.get("expires_in"), int | float)
    ]
    return max(lefts) if lefts else None


def _open(thread: str, interrupts: Sequence[Any], name: str | None) -> _Run:
    """A new saga, or the suspended one this thread resumes (kept here, or carried by the
    pending interrupt's value when another process suspended it)."""
    _ensure_runtime()
    with _lock:
        if thread in _runs:
            raise RuntimeError(f"thread {thread!r} is already running a governed graph run")
        held = _suspended.pop(thread, None) if interrupts else None
    if interrupts and held is None:
        held = _journal_from(interrupts)
    if held:
        saga = Saga.resume(str(held["saga_id"]), list(held.get("journal") or []), name=held.get("name"))
        run = _Run(saga, dict(held.get("outputs") or {}))
    else:
        run = _Run(Saga(name=name or f"langgraph:{thread}"[:200]))
    with _lock:
        _runs[thread] = run
    return run


def _suspend(thread: str, run: _Run, interrupts: Sequence[Any], resume_grace: float) -> None:
    left = _deadline(interrupts)
    ttl = DEFAULT_SUSPEND_TTL_S if left is None else left + resume_grace
    journal = run.saga.suspend(ttl)
    with _lock:
        _suspended[thread] = {
            "saga_id": run.saga.saga_id,
            "name": run.saga.name,
            "journal": journal,
            "outputs": run.outputs,
        }


def _forget(thread: str) -> None:
    with _lock:
        _runs.pop(thread, None)


def invoke(
    graph: Any,
    input: Any,
    config: RunnableConfig,
    *,
    name: str | None = None,
    resume_grace: float = DEFAULT_RESUME_GRACE_S,
    **kwargs: Any,
) -> Any:
    """`graph.invoke(input, config)` as one saga (see the module docstring). The config names the
    thread (`configurable.thread_id`) and the graph has a checkpointer."""
    thread = _thread_of(config)
    if not thread:
        raise ValueError("a governed graph run needs config['configurable']['thread_id']")
    run = _open(thread, graph.get_state(config).interrupts, name)
    saga = run.saga
    try:
        saga.__enter__()
        try:
            out = graph.invoke(input, config, **kwargs)
        except BaseException as exc:
            saga.__exit__(type(exc), exc, exc.__traceback__)  # rolls back; raises SagaAborted
            raise
        interrupts = graph.get_state(config).interrupts
        if interrupts:
            _suspend(thread, run, interrupts, resume_grace)
        else:
            saga.__exit__(None, None, None)
        return out
    finally:
        _forget(thread)


async def ainvoke(
    graph: Any,
    input: Any,
    config: RunnableConfig,
    *,
    name: str | None = None,
    resume_grace: float = DEFAULT_RESUME_GRACE_S,
    **kwargs: Any,
) -> Any:
    """`invoke` for async graphs (`graph.ainvoke`)."""
    thread = _thread_of(config)
    if not thread:
        raise ValueError("a governed graph run needs config['configurable']['thread_id']")
    run = _open(thread, (await graph.aget_state(config)).interrupts, name)
    saga = run.saga
    try:
        await saga.__aenter__()
        try:
            out = await graph.ainvoke(input, config, **kwargs)
        except BaseException as exc:
            await saga.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        interrupts = (await graph.aget_state(config)).interrupts
        if interrupts:
            _suspend(thread, run, interrupts, resume_grace)
        else:
            await saga.__aexit__(None, None, None)
        return out
    finally:
        _forget(thread)


# -- the governed tool ---------------------------------------------------------------------------


def _call_of(input: Any) -> tuple[dict[str, Any], str]:
    """(arguments, tool call id) of what a tool is invoked with."""
    if isinstance(input, dict) and input.get("type") == "tool_call":
        return dict(input.get("args") or {}), str(input.get("id") or "")
    if isinstance(input, dict):
        return dict(input), ""
    return {"input": input}, ""


def _with_arguments(input: Any, resolved: dict[str, Any] | None) -> Any:
    """The tool's input with the arguments as resolved for this attempt (the policy's `secret` ones:
    their credentials), or unchanged."""
    if resolved is None:
        return input
    if isinstance(input, dict) and input.get("type") == "tool_call":
        return {**input, "args": {**(input.get("args") or {}), **resolved}}
    if isinstance(input, dict):
        return {**input, **resolved}
    return resolved.get("input", input)


class GovernedTool(BaseTool):
    """A LangChain tool whose calls are saga steps under a tool policy (made by `govern`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    governor: Any = None
    visible: frozenset[str] | None = None  # the argument names the model sees (None: any)

    @classmethod
    def wrap(cls, inner: BaseTool, governor: core.Governor) -> GovernedTool:
        schema = inner.tool_call_schema  # built on every access: read once per tool
        return cls(
            name=inner.name,
            description=inner.description,
            args_schema=inner.args_schema,
            return_direct=inner.return_direct,
            response_format=inner.response_format,
            tags=inner.tags,
            metadata=inner.metadata,
            extras=inner.extras,
            inner=inner,
            governor=governor,
            visible=frozenset(schema.model_fields) if hasattr(schema, "model_fields") else None,
        )

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # every call goes through invoke
        raise NotImplementedError("a governed tool is called through invoke / ainvoke")

    def _arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """What the model chose: injected arguments (graph state, store, runtime) left out."""
        visible = self.visible
        if visible is None or visible.issuperset(arguments):
            return arguments
        return {k: v for k, v in arguments.items() if k in visible}

    def _refused(self, input: Any, call_id: str, refused: core.Refused) -> Any:
        if not call_id:
            return refused.message
        return ToolMessage(
            content=refused.message,
            tool_call_id=call_id,
            name=self.name,
            status="error",
            artifact=refused.payload(),
        )

    def _interrupt_value(self, run: _Run, pending: core.Pending) -> dict[str, Any]:
        saga = run.saga
        held: dict[str, Any] = {"saga_id": saga.saga_id, "name": saga.name, "journal": saga.journal()}
        held["outputs"] = {k: v for k, v in run.outputs.items() if _small(v)}
        return {**pending.payload(), MARK: held}

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        arguments, call_id = _call_of(input)
        arguments = self._arguments(arguments)
        thread = _thread_of(config if config is not None else ensure_config())
        governor: core.Governor = self.governor
        run = _runs.get(thread)  # one dict read: atomic

        def perform(resolved: dict[str, Any] | None = None) -> Any:
            return self.inner.invoke(_with_arguments(input, resolved), config, **kwargs)

        if run is None or not call_id:  # a saga of its own; an approval is waited for
            _ensure_runtime()
            with Saga(name=f"langgraph:{self.name}") as saga:
                try:
                    return governor.call_sync(saga, self.name, arguments, perform, call_id=call_id)
                except core.Refused as refused:  # nothing ran: the saga ends complete
                    return self._refused(input, call_id, refused)
        step_id = core.step_id_for(run.saga.saga_id, call_id)
        if step_id in run.outputs:  # ran before the run paused (a sibling of the interrupted call)
            return _replay(run.outputs[step_id], call_id, self.name)
        while True:
            try:
                out = governor.call_sync(
                    run.saga, self.name, arguments, perform, call_id=call_id, step_id=step_id, wait=False
                )
            except core.Refused as refused:
                return self._refused(input, call_id, refused)
            except core.Pending as pending:
                interrupt(self._interrupt_value(run, pending))  # returns once resumed: ask again
                continue
            run.outputs[step_id] = _record(out)
            return out

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        arguments, call_id = _call_of(input)
        arguments = self._arguments(arguments)
        thread = _thread_of(config if config is not None else ensure_config())
        governor: core.Governor = self.governor
        run = _runs.get(thread)  # one dict read: atomic

        def perform(resolved: dict[str, Any] | None = None) -> Any:
            return self.inner.ainvoke(_with_arguments(input, resolved), config, **kwargs)

        if run is None or not call_id:
            _ensure_runtime()
            async with Saga(name=f"langgraph:{self.name}") as saga:
                try:
                    return await governor.call(saga, self.name, arguments, perform, call_id=call_id)
                except core.Refused as refused:
                    return self._refused(input, call_id, refused)
        step_id = core.step_id_for(run.saga.saga_id, call_id)
        if step_id in run.outputs:
            return _replay(run.outputs[step_id], call_id, self.name)
        while True:
            try:
                out = await governor.call(
                    run.saga, self.name, arguments, perform, call_id=call_id, step_id=step_id, wait=False
                )
            except core.Refused as refused:
                return self._refused(input, call_id, refused)
            except core.Pending as pending:
                interrupt(self._interrupt_value(run, pending))
                continue
            run.outputs[step_id] = _record(out)
            return out


def _record(out: Any) -> Any:
    """What a finished call returned, kept to answer a re-run of the same tool call."""
    if isinstance(out, ToolMessage):
        return {"content": out.content, "status": out.status, "artifact": out.artifact}
    return {"content": out, "status": "success", "artifact": None, "plain": True}


def _small(recorded: Any) -> bool:
    try:
        return len(json.dumps(recorded)) <= 65536
    except (TypeError, ValueError):
        return False


def _replay(recorded: dict[str, Any], call_id: str, name: str) -> Any:
    if recorded.get("plain"):
        return recorded["content"]
    return ToolMessage(
        content=recorded["content"],
        tool_call_id=call_id,
        name=name,
        status=recorded.get("status") or "success",
        artifact=recorded.get("artifact"),
    )


__all__ = ["GovernedTool", "ainvoke", "govern", "invoke"]
