"""The OpenAI Agents SDK: `FunctionTool`s governed by a tool policy.

    from agents import Agent
    from sagaplane.integrations import openai_agents as spoa

    tools = spoa.govern([search, charge_card, refund_charge], policy="tools.toml")
    agent = Agent(name="shop", tools=tools, model=...)
    result = await spoa.run(agent, "Buy the blue mug")        # one run: one saga
    while result.interruptions:                               # Sagaplane waits for a person
        state = result.to_state()
        await spoa.decide(state, wait=20)                      # approve / reject what people decided
        result = await spoa.run(agent, state)                  # the same saga continues

Each call of a governed tool is a step of the run's saga (`integrations.core.Governor`): the gate
first (halts, budgets, rate limits, approvals), the intent in the WAL, the call, its outcome; the
policy's compensation is a registered compensator. A refused call never reaches the tool: the
model gets the refusal as the tool's output (a sentence it can act on).

A call an approval policy holds becomes the SDK's tool-approval interruption: the governed tool's
`needs_approval` asks the gate (without waiting) and answers True while a Sagaplane approval is
pending. `decide(state)` reads Sagaplane's decisions and applies them to the run state:
approved → `state.approve(item)` (the resumed call then consumes the approval and runs once),
denied or expired → `state.reject(item, rejection_message=...)` (the model reads why), still
pending → left as it is. A run with interruptions keeps its saga open (its lease renewed by this
process) until it is resumed with `run(agent, state)`; the run finishing completes the saga, an
exception rolls it back (newest step first) and is raised as `sagaplane.SagaAborted`.

A governed tool called outside `run` (plain `Runner.run`) is a saga of its own and waits for a
pending approval instead of interrupting. Configuration: `sagaplane.configure(...)`, or, when
nothing configured the SDK, the environment (SAGAPLANE_URL, SAGAPLANE_API_KEY, SAGAPLANE_AGENT,
SAGAPLANE_WAL) read at the first call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from agents import FunctionTool, RunContextWrapper, Runner, RunResult, RunState
from agents.tool_context import ToolContext

from ..runtime import configure, get_runtime
from ..saga import Saga, get_default_gate
from . import core
from .policy import Policy, load

_current: ContextVar[_Run | None] = ContextVar("sagaplane_openai_run", default=None)


class _Run:
    def __init__(self, saga: Saga) -> None:
        self.saga = saga
        self.pending: dict[str, core.Pending] = {}  # tool call id -> the approval it waits for


_held: dict[str, _Run] = {}  # tool call id of an interruption -> its run (until resumed)
_lock = threading.Lock()


def _ensure_runtime() -> None:
    if get_runtime() is None:
        configure()


def govern(tools: Sequence[FunctionTool], *, policy: str | Path | Policy) -> list[FunctionTool]:
    """The tools governed by the policy (same names, descriptions and schemas). The policy's
    compensations and captures call tools of this list by name (ungoverned)."""
    rules = policy if isinstance(policy, Policy) else load(policy)
    by_name = {t.name: t for t in tools}

    async def run_tool(name: str, arguments: dict[str, Any], idempotency_key: str | None = None) -> Any:
        target = by_name.get(name)
        if target is None:
            raise LookupError(f"the policy {rules.name!r} calls {name!r}, which is not among the tools")
        text = json.dumps(arguments)
        call_id = f"sagaplane-{idempotency_key or 'capture'}"
        context = ToolContext(None, tool_name=name, tool_call_id=call_id, tool_arguments=text)
        return await target.on_invoke_tool(context, text)

    core.register_compensators(rules, run_tool)
    governor = core.Governor(rules, view_result=_view, capture=run_tool)
    return [_governed(t, governor) for t in tools]


def _view(out: Any) -> Any:
    """`{result.…}`: a tool's output, JSON-decoded when it is JSON text."""
    if isinstance(out, str):
        try:
            return json.loads(out)
        except ValueError:
            return out
    return out


def _governed(tool: FunctionTool, governor: core.Governor) -> FunctionTool:
    inner_invoke = tool.on_invoke_tool
    inner_approval = tool.needs_approval
    name = tool.name

    async def needs_approval(context: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        if inner_approval is True:
            return True
        if callable(inner_approval) and await inner_approval(context, params, call_id):
            return True
        run = _current.get()
        if run is None:
            return False
        step_id = core.step_id_for(run.saga.saga_id, call_id)
        pending = await governor.preflight(run.saga, name, params, step_id=step_id)
        if pending is None:
            return False
        run.pending[call_id] = pending
        with _lock:
            _held[call_id] = run
        return True

    async def on_invoke_tool(context: ToolContext[Any], arguments_json: str) -> Any:
        try:
            arguments = json.loads(arguments_json) if arguments_json else {}
        except ValueError:
            arguments = {"arguments": arguments_json}
        if not isinstance(arguments, dict):
            arguments = {"arguments": arguments}
        call_id = context.tool_call_id

        def perform(resolved: dict[str, Any] | None = None) -> Any:
            # `resolved`: the arguments with the policy's `secret` ones resolved for this attempt.
            return inner_invoke(context, arguments_json if resolved is None else json.dumps(resolved))

        run = _current.get()
        if run is None:  # a saga of its own; an approval is waited for
            _ensure_runtime()
            async with Saga(name=f"openai-agents:{name}") as saga:
                try:
                    return await governor.call(saga, name, arguments, perform, call_id=call_id)
                except core.Refused as refused:  # nothing ran: the saga ends complete
                    return refused.message
        try:
            step_id = core.step_id_for(run.saga.saga_id, call_id)
            return await governor.call(
                run.saga, name, arguments, perform, call_id=call_id, step_id=step_id, wait=False
            )
        except core.Refused as refused:
            return refused.message
        except core.Pending as pending:
            return (
                f"The tool {name} did not run: approval {pending.approval_id} is still pending in "
                "Sagaplane. Do not retry it now; tell the user it waits for a person."
            )

    governed = dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=needs_approval)
    return governed


# -- the run -------------------------------------------------------------------------------------


def _interruption_ids(result_or_state: Any) -> list[str]:
    items = (
        result_or_state.get_interruptions()
        if isinstance(result_or_state, RunState)
        else list(getattr(result_or_state, "interruptions", None) or [])
    )
    ids = []
    for item in items:
        call_id = getattr(item, "call_id", None) or getattr(getattr(item, "raw_item", None), "call_id", None)
        if call_id:
            ids.append(str(call_id))
    return ids


def _held_run(state: RunState[Any, Any]) -> _Run | None:
    with _lock:
        for call_id in _interruption_ids(state):
            run = _held.get(call_id)
            if run is not None:
                return run
    return None


def _release(run: _Run) -> None:
    with _lock:
        for call_id in [k for k, v in _held.items() if v is run]:
            del _held[call_id]


async def run(agent: Any, input: Any, *, name: str | None = None, **kwargs: Any) -> RunResult:
    """`Runner.run(agent, input, **kwargs)` as one saga (see the module docstring): resuming from
    a run state continues the saga its interruption held open."""
    _ensure_runtime()
    held = _held_run(input) if isinstance(input, RunState) else None
    fresh = held is None
    active = held or _Run(Saga(name=name or f"openai-agents:{getattr(agent, 'name', 'agent')}"[:200]))

    async def body() -> RunResult:
        # A task of its own: the saga's context never leaks into the caller between resumptions.
        if fresh:
            await active.saga.__aenter__()
        _current.set(active)
        try:
            result = await Runner.run(agent, input, **kwargs)
        except BaseException as exc:
            _release(active)
            await active.saga.__aexit__(type(exc), exc, exc.__traceback__)  # rolls back
            raise
        if not result.interruptions:
            _release(active)
            await active.saga.__aexit__(None, None, None)
        return result

    return await asyncio.create_task(body())


async def decide(state: RunState[Any, Any], *, wait: float = 0.0) -> int:
    """Apply Sagaplane's decisions to the run state's interruptions this module raised: approved
    ones are approved, denied or expired ones rejected with a sentence for the model. Waits at
    most `wait` seconds (per request) for a decision. Returns how many are still pending."""
    gate = get_default_gate()
    still = 0
    for item in state.get_interruptions():
        call_id = getattr(item, "call_id", None) or getattr(getattr(item, "raw_item", None), "call_id", None)
        with _lock:
            held = _held.get(str(call_id))
        pending = held.pending.get(str(call_id)) if held is not None else None
        if pending is None:
            continue
        if gate is None:
            raise RuntimeError("Sagaplane's gate is off (sagaplane.configure(gate=...)): nothing to ask")
        try:
            answer = await asyncio.to_thread(gate.approval_status, pending.approval_id, wait)
        except Exception as exc:  # unreadable: the call stays paused
            raise RuntimeError(f"approval {pending.approval_id} cannot be read: {exc}") from exc
        status = answer.get("status")
        if status == "approved":
            state.approve(item)
        elif status == "pending":
            still += 1
        else:
            reason = "approval_denied" if status == "denied" else "approval_expired"
            refused = core.Refused(reason, pending.tool, {"note": answer.get("note") or ""})
            state.reject(item, rejection_message=refused.message)
    return still


__all__ = ["decide", "govern", "run"]
