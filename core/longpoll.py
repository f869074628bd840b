"""What the long-polls share: the `wait` a body asks for, the loop that re-reads until there is
work or the wait is over, holding no database connection in between, and the pause between two
reads, which ends at once when nobody waits for the answer any more.

A long-poll runs in a thread of its own (Django runs a sync view in a thread per request), which
nothing can interrupt: a client that went away, or a server told to stop, left the thread
sleeping for the rest of its wait (up to 25 s), and the process could not exit before it ended
(`make run`'s server ignored SIGTERM that long). `abandon_when_done` wraps the ASGI application:
each request gets an event, seen by its view's thread through a context variable (asgiref copies
the context into it), set as soon as the client disconnects or the server cancels the request
(daphne cancels every request when it stops); `pause` waits on it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from django.db import connection
from django.http import HttpRequest

from core.numbers import finite_number

MAX_WAIT_S = 25.0
"""The longest one call waits: under the ~30 s after which proxies and MCP clients give up."""

_abandoned: ContextVar[threading.Event | None] = ContextVar("sagaplane_request_abandoned", default=None)
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def abandon_when_done(app: ASGIApp) -> ASGIApp:
    """`app`, with each HTTP request's long-polls released as soon as the request is over for
    the server: its client disconnected (seen by `receive`), or the server cancels it (it stops).
    The event is set before Django unwinds the request, which waits for the view's thread."""

    async def application(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        event = threading.Event()

        async def watched_receive() -> Any:
            message = await receive()
            if message.get("type") == "http.disconnect":
                event.set()
            return message

        token = _abandoned.set(event)
        try:
            inner = asyncio.ensure_future(app(scope, watched_receive, send))  # with the event
        finally:
            _abandoned.reset(token)
        try:
            # asyncio.wait, not await: a cancellation lands here first, and is passed on below.
            await asyncio.wait({inner})
        except asyncio.CancelledError:
            event.set()
            inner.cancel()
            await asyncio.wait({inner})
            raise
        finally:
            event.set()
        inner.result()

    return application


def abandoned() -> bool:
    """Whether nobody waits for this request's answer any more (never, outside an ASGI request)."""
    event = _abandoned.get()
    return event is not None and event.is_set()


def pause(seconds: float) -> bool:
    """Sleep up to `seconds` between two reads of a long-poll; True (at once) when the request
    was abandoned, and the caller should answer what it has."""
    event = _abandoned.get()
    if event is None:
        time.sleep(seconds)
        return False
    return event.wait(seconds)


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
        if pause(interval):
            return response
