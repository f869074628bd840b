"""The one wait-until for tests and benchmarks: poll a condition until it holds, with a deadline.

The outcome never depends on how long the wait takes; the deadline only cuts a hung run short, and
the interval is a poll interval, not synchronisation (the condition decides)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

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
        if alive is not None and alive.poll() is not None:
            _fail(f"{what}: the process exited ({alive.returncode}) first", context)
        if time.monotonic() > end:
            _fail(f"timed out waiting for {what} ({deadline:g} s)", context)
        time.sleep(every)


def _fail(message: str, context: Callable[[], object] | None) -> None:
    raise AssertionError(message + (f"\n{context()}" if context is not None else ""))
