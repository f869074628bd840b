"""The one wait-until for tests and benchmarks: poll a condition until it holds, with a deadline.

The outcome never depends on how long the wait takes; the deadline only cuts a hung run short, and
the interval is a poll interval, not synchronisation (the condition decides). `wait_until` blocks
its thread; `wait_until_async` is the same wait for a coroutine (under asyncio or anyio), whose
condition may itself be awaited."""

from __future__ import annotations

import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio

T = TypeVar("T")

DEADLINE_S = 60.0


def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    deadline: float = DEADLINE_S,
    every: float = 0.05,
    alive: subprocess.Popen[Any] | None = None,
    context: Callable[[], object] | None = None,
) -> T:
    """`condition()`'s first truthy value, re-checked every `every` seconds for up to `deadline`.

    Fails (AssertionError) naming `what` when the deadline passes, or at once when the process
    `alive` exits first (it would never make the condition true); `context()`, when given, adds
    what helps to read the failure (a server's log tail, say)."""
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        _fail_if_hopeless(what, end, deadline, alive, context)
        time.sleep(every)


# Typed apart so that T is what an awaitable condition's result is, not the awaitable.
@overload
async def wait_until_async(
    condition: Callable[[], Awaitable[T]],
    what: str,
    *,
    deadline: float = ...,
    every: float = ...,
    alive: subprocess.Popen[Any] | None = ...,
    context: Callable[[], object] | None = ...,
) -> T: ...


@overload
async def wait_until_async(
    condition: Callable[[], T],
    what: str,
    *,
    deadline: float = ...,
    every: float = ...,
    alive: subprocess.Popen[Any] | None = ...,
    context: Callable[[], object] | None = ...,
) -> T: ...


async def wait_until_async(
    condition: Callable[[], Any],
    what: str,
    *,
    deadline: float = DEADLINE_S,
    every: float = 0.05,
    alive: subprocess.Popen[Any] | None = None,
    context: Callable[[], object] | None = None,
) -> Any:
    """`wait_until` in a coroutine: the event loop runs on between checks. `condition()` may
    return an awaitable (an `async def`), whose result is then the value checked."""
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        _fail_if_hopeless(what, end, deadline, alive, context)
        await anyio.sleep(every)


def _fail_if_hopeless(
    what: str,
    end: float,
    deadline: float,
    alive: subprocess.Popen[Any] | None,
    context: Callable[[], object] | None,
) -> None:
    """Fail when the process the condition depends on has exited, or the deadline has passed."""
    if alive is not None and alive.poll() is not None:
        _fail(f"{what}: the process exited ({alive.returncode}) first", context)
    if time.monotonic() > end:
        _fail(f"timed out waiting for {what} ({deadline:g} s)", context)


def _fail(message: str, context: Callable[[], object] | None) -> None:
    raise AssertionError(message + (f"\n{context()}" if context is not None else ""))
