"""What a saga's code finds around it: the saga running in this context, the ids an integration
sets around one governed call, and the process defaults `sagaplane.configure()` sets (the WAL,
the confirmation hook, the gate)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .wal import ENV_AGENT, WAL

if TYPE_CHECKING:
    from .gate import Gate
    from .saga import Saga
    from .steps import ConfirmHook

active_saga: ContextVar[Saga | None] = ContextVar("sagaplane_current_saga", default=None)
# Set by an integration around one governed call: the framework's id of the tool call (a model's
# tool call id), carried by the step's span as gen_ai.tool.call.id.
tool_call_id: ContextVar[str] = ContextVar("sagaplane_tool_call_id", default="")
# Set by an integration whose framework re-runs a paused call (LangGraph's interrupt/resume): the
# next step's id, derived from the tool call, so the re-run is the same step to the gate (and finds
# the approval request the first run opened). Empty: a random id.
next_step_id: ContextVar[str] = ContextVar("sagaplane_next_step_id", default="")


def current_saga() -> Saga | None:
    return active_saga.get()


# The process default WAL, confirmation hook and gate, set by sagaplane.configure().
_defaults: dict[str, Any] = {"wal": None, "confirm": None, "gate": None}


def set_default_gate(gate: Gate | None) -> None:
    _defaults["gate"] = gate


def get_default_gate() -> Gate | None:
    return _defaults["gate"]


def set_default_wal(wal: WAL | None) -> None:
    _defaults["wal"] = wal


def get_default_wal() -> WAL:
    wal = _defaults["wal"]
    if wal is None:
        path = os.environ.get("SAGAPLANE_WAL", "sagaplane.wal")
        wal = WAL(path, agent=os.environ.get(ENV_AGENT) or None)
        _defaults["wal"] = wal
    return wal


def set_default_confirm(confirm: ConfirmHook | None) -> None:
    _defaults["confirm"] = confirm


def get_default_confirm() -> ConfirmHook | None:
    return _defaults["confirm"]


def run_coro(awaitable: Awaitable[Any]) -> Any:
    """Run an awaitable from sync code (a sync saga calling an async hook or compensator)."""

    async def wrap() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wrap())
    # A loop is running in this thread: run the coroutine on a private loop in a helper thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wrap()).result()
