"""Database work a test's coroutine hands to a worker thread: the thread's connection is closed
after it. Left open, it would hold one of the process' pooled connections (the in-process live
server draws on the same pool) until the process ends, and the Django test client never closes
it: its requests do not send the signal that would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a worker thread (under asyncio or anyio alike)."""
    from django.db import connections

    def run() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return await anyio.to_thread.run_sync(run)
