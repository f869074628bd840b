"""What the claim long-polls share: the `wait` a body asks for, and the loop that re-reads until
there is work or the wait is over, holding no database connection in between."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.http import HttpRequest

from controlplane.numbers import finite_number

MAX_WAIT_S = 25.0
"""The longest one call waits: under the ~30 s after which proxies and MCP clients give up."""


def release_connection() -> None:
    """Return this thread's database connection (to the pool, or closed) before a long-poll
    waits, unless a transaction holds it. A held connection per waiting client took a process's
    whole pool (DB_POOL_MAX_SIZE): with a handful of SDKs long-polling, every other request in
    that process waited DB_POOL_TIMEOUT for a connection and failed. The next read reconnects."""
    if not connection.in_atomic_block:
        connection.close()


def body_wait(request: HttpRequest) -> float:
    """The `wait` (seconds, at most MAX_WAIT_S) of a JSON body; 0 for anything else (a malformed
    or oversized body is the handler's to refuse when it reads it)."""
    try:
        body = json.loads(request.body or b"{}")
        wait = body.get("wait", 0) if isinstance(body, dict) else 0
    except Exception:
        return 0.0
    if not finite_number(wait) or wait < 0:
        return 0.0
    return min(float(wait), MAX_WAIT_S)


def poll(
    answer: Callable[[], Any], *, found: Callable[[dict[str, Any]], bool], wait: float, interval: float
) -> Any:
    """Call `answer` (a view's dispatch) until its 200 body is `found`, anything else comes back,
    or `wait` seconds pass; between calls, sleep `interval` holding no connection."""
    deadline = time.monotonic() + wait
    while True:
        response = answer()
        data = getattr(response, "data", None)
        if (
            response.status_code != 200
            or not isinstance(data, dict)
            or found(data)
            or time.monotonic() + interval >= deadline
        ):
            return response
        release_connection()
        time.sleep(interval)
