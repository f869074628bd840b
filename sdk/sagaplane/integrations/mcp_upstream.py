"""The MCP gateway's side towards its upstream server: a client session over stdio (a process the
gateway starts) or streamable HTTP, with bounds a broken or hostile upstream cannot push past.

- stdio: the process gets the gateway's own environment minus Sagaplane's settings (its
  credentials are the gateway's configuration, never anything a client sent); each message it
  writes is capped (`max_message_bytes`): an oversized answer to a request becomes an error
  response to that request (its outcome unknown), any other oversized line is dropped.
- HTTP: only the headers given on the command line (`--upstream-header`) are sent; server-sent
  events are capped at the same size.

`UpstreamThread` holds one session on a loop of its own for synchronous callers (the recovery
worker's compensators), reconnecting when the upstream went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import subprocess
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.session import ClientSession
from mcp.shared.message import SessionMessage

logger = logging.getLogger("sagaplane.mcp")

DEFAULT_MAX_MESSAGE_BYTES = 8 << 20
_ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,200}"|-?\d{1,20})')
IDEMPOTENCY_META = "sagaplane/idempotency_key"
OVERSIZED = "answer over"  # the error a too-large answer to a request becomes


@dataclass
class UpstreamSpec:
    """Where the upstream server is: a command (stdio) or a URL (streamable HTTP)."""

    command: list[str] = field(default_factory=list)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    stderr: Any = None  # where the upstream process' stderr goes (default: inherited)
    env: dict[str, str] = field(default_factory=dict)  # set for the process, over the stripped one

    def describe(self) -> str:
        return self.url or " ".join(self.command)


def upstream_environment() -> dict[str, str]:
    """The gateway's environment without Sagaplane's own settings (its API key above all)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SAGAPLANE_")}


def _oversized(line_head: bytes, limit: int) -> SessionMessage | None:
    """An error response for the request an oversized line answered (None: not a response)."""
    match = _ID.search(line_head)
    if match is None or (b'"result"' not in line_head and b'"error"' not in line_head):
        return None
    request_id = json.loads(match.group(1))
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=types.INTERNAL_ERROR, message=f"{OVERSIZED} {limit} bytes"),
    )
    return SessionMessage(error)


async def _read_lines(
    process: Process, send: Any, limit: int
) -> None:  # the stdout reader: bounded lines -> SessionMessages
    assert process.stdout is not None
    buffer = bytearray()
    skipping = False
    head = b""
    async for chunk in process.stdout:
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            if not skipping:
                buffer += piece
                if len(buffer) > limit:
                    head, skipping = bytes(buffer[:4096]), True
                    buffer.clear()
            if newline < 0:
                break
            start = newline + 1
            if skipping:
                skipping = False
                logger.warning("upstream wrote a message larger than %d bytes; dropped", limit)
                replacement = _oversized(head, limit)
                if replacement is not None:
                    await send.send(replacement)
                continue
            line, buffer = bytes(buffer), bytearray()
            if not line.strip():
                continue
            try:
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValueError as exc:
                await send.send(exc)
                continue
            await send.send(SessionMessage(message))


@contextlib.asynccontextmanager
async def bounded_stdio(spec: UpstreamSpec) -> AsyncIterator[tuple[Any, Any]]:
    """The upstream process as a (read, write) pair of message streams."""
    process = await anyio.open_process(
        spec.command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=spec.stderr,
        env={**upstream_environment(), **spec.env},
        start_new_session=True,
    )
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)

    async def reader() -> None:
        async with read_send:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await _read_lines(process, read_send, spec.max_message_bytes)

    async def writer() -> None:
        assert process.stdin is not None
        async with write_recv:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            with anyio.CancelScope(shield=True):
                await write_send.aclose()
                if process.stdin is not None:
                    with contextlib.suppress(Exception):
                        await process.stdin.aclose()
                with anyio.move_on_after(2):
                    await process.wait()
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.terminate()
                    with anyio.move_on_after(2):
                        await process.wait()
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def transport(spec: UpstreamSpec) -> AsyncIterator[tuple[Any, Any]]:
    if spec.url:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        client = create_mcp_http_client(headers=dict(spec.headers))
        async with (
            client,
            streamable_http_client(
                spec.url, http_client=client, max_sse_event_size=spec.max_message_bytes
            ) as streams,
        ):
            yield streams
        return
    async with bounded_stdio(spec) as streams:
        yield streams


@contextlib.asynccontextmanager
async def connect(spec: UpstreamSpec, **session_kwargs: Any) -> AsyncIterator[ClientSession]:
    """An initialized client session with the upstream server."""
    async with transport(spec) as (read, write), ClientSession(read, write, **session_kwargs) as session:
        with anyio.fail_after(30):
            await session.initialize()
        yield session


def text_of(result: types.CallToolResult) -> str:
    for item in result.content:
        if isinstance(item, types.TextContent):
            return item.text
    return ""


def result_view(result: Any) -> Any:
    """What a policy template reads as `{result.…}`: structuredContent, else the JSON of the
    first text content (None when it is not JSON)."""
    if not isinstance(result, types.CallToolResult):
        return result
    if result.structured_content is not None:
        return result.structured_content
    text = text_of(result)
    try:
        return json.loads(text)
    except ValueError:
        return None


def is_error(result: Any) -> bool:
    return isinstance(result, types.CallToolResult) and bool(result.is_error)


class UpstreamThread:
    """One upstream session on a private event loop, for synchronous callers."""

    def __init__(self, spec: UpstreamSpec, *, call_timeout: float = 120.0) -> None:
        self.spec = spec
        self.call_timeout = call_timeout
        self._loop = asyncio.new_event_loop()
        self._session: ClientSession | None = None
        self._ready = threading.Event()
        self._closing: asyncio.Event | None = None
        self._lost: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="sagaplane-mcp-upstream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._closing = asyncio.Event()
        while not self._closing.is_set():
            self._lost = asyncio.Event()
            try:
                async with connect(self.spec) as session:
                    self._session = session
                    self._ready.set()
                    closing = asyncio.ensure_future(self._closing.wait())
                    lost = asyncio.ensure_future(self._lost.wait())
                    await asyncio.wait({closing, lost}, return_when=asyncio.FIRST_COMPLETED)
                    closing.cancel()
                    lost.cancel()
            except Exception as exc:  # the upstream could not be reached: try again shortly
                logger.warning("upstream %s: %r", self.spec.describe(), exc)
            self._session = None
            self._ready.clear()
            if not self._closing.is_set():
                await asyncio.sleep(1.0)

    async def _call(self, tool: str, arguments: dict[str, Any], key: str | None) -> types.CallToolResult:
        session = self._session
        if session is None:
            raise ConnectionError("upstream not connected")
        meta = {IDEMPOTENCY_META: key} if key else None
        try:
            result = await session.call_tool(
                tool, arguments, read_timeout_seconds=self.call_timeout, meta=cast(Any, meta)
            )
        except Exception:
            if self._lost is not None:
                self._lost.set()  # reconnect before the next call
            raise
        assert isinstance(result, types.CallToolResult)
        return result

    def call(self, tool: str, arguments: dict[str, Any], key: str | None = None) -> types.CallToolResult:
        """Call `tool`; raises when the upstream cannot be reached, the call fails or times out."""
        if not self._ready.wait(timeout=30):
            raise ConnectionError(f"upstream {self.spec.describe()} is not reachable")
        future = asyncio.run_coroutine_threadsafe(self._call(tool, arguments, key), self._loop)
        return future.result(timeout=self.call_timeout + 10)

    def close(self) -> None:
        closing = self._closing
        if closing is not None:
            self._loop.call_soon_threadsafe(closing.set)
        self._thread.join(timeout=10)


def compensation_runner(upstream: Callable[[str, dict[str, Any], str | None], Any]) -> Callable[..., Any]:
    """A sync `run_tool` for `core.register_compensators`: an error result fails the attempt."""

    def run(tool: str, arguments: dict[str, Any], key: str | None = None) -> Any:
        result = upstream(tool, arguments, key)
        if is_error(result):
            raise RuntimeError(f"{tool} answered with an error: {text_of(result)[:500]}")
        return result_view(result)

    return run
