"""`sagaplane mcp-gateway`: any MCP client's tool calls to any MCP server, governed.

    sagaplane mcp-gateway --policy tools.toml -- python my_server.py     # serves stdio
    sagaplane mcp-gateway --policy tools.toml --upstream-url http://127.0.0.1:9000/mcp \\
        --listen 127.0.0.1:8765                                          # streamable HTTP

Built on the `mcp` package (the `sagaplane[mcp]` extra): a low-level `Server` towards the client,
a `ClientSession` towards the upstream (`mcp_upstream`). Only `tools/list` and `tools/call` are
interpreted; a middleware passes every other request and notification through unchanged, both
ways (resources, prompts, completion, sampling, elicitation, logging, list changes, progress).

- `tools/list`: the upstream's tools, annotated from the policy (`readOnlyHint` for PREVIEW,
  `destructiveHint` for IRREVERSIBLE, the semantics in `_meta["sagaplane/semantics"]`); a tool
  the policy refuses is not offered. With `--boundary explicit` the gateway adds `saga_commit`
  and `saga_rollback`.
- `tools/call`: one saga step through `core.Governor` (gate, intent fsynced, the call forwarded,
  its outcome committed). Refusals come back as a result with `isError: true`, a sentence in
  the text and the reason in `structuredContent`; the upstream is never called. A pending
  approval holds the call and sends `notifications/progress` (when the client gave a progress
  token) until it is decided or its TTL ends. The result carries the saga id in
  `_meta["sagaplane/saga_id"]`; a client may choose the saga with the same key in the request's
  `_meta`.
- The saga boundary: `session` (default) -- the connection's calls are one saga, completed when
  the client ends the session; the gateway killed mid-session leaves the saga to recovery
  (its lease runs out; `sagaplane worker --policy FILE -- UPSTREAM` runs the compensations
  through the upstream). `explicit` -- as session, plus the two saga tools (rollback runs the
  compensations through the upstream, newest first; the next call opens a new saga). `none` --
  each call a saga of its own, completed at once (gate, limits and evidence; no rollback).
- Observe mode (`--observe`): every call is forwarded (recorded as an IRREVERSIBLE step, halts
  still apply) and `--emit-policy FILE` is rewritten with every tool seen, each IRREVERSIBLE with
  a TODO.
- An upstream that does not answer within `--call-timeout` (or crashes mid-call) leaves the step
  unknown: the result says so and recovery compensates it by its semantics.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from ..saga import RollbackReport, Saga
from ..semantics import IRREVERSIBLE, PREVIEW, Semantics
from ..wal import WAL
from . import core
from .mcp_upstream import (
    IDEMPOTENCY_META,
    OVERSIZED,
    UpstreamSpec,
    connect,
    is_error,
    result_view,
    text_of,
)
from .policy import Policy, skeleton

logger = logging.getLogger("sagaplane.mcp")

SAGA_META = "sagaplane/saga_id"
CONNECT_DEADLINE_S = 30.0
SEMANTICS_META = "sagaplane/semantics"
COMMIT, ROLLBACK = "saga_commit", "saga_rollback"
LOCAL_METHODS = frozenset({"initialize", "ping", "tools/list", "tools/call", "server/discover"})
LOCAL_NOTIFICATIONS = frozenset({"notifications/initialized", "notifications/cancelled"})
_ANY = TypeAdapter(dict[str, Any])
_Request = types.Request[dict[str, Any] | None, str]
_Notification = types.Notification[dict[str, Any] | None, str]


@dataclass
class GatewayConfig:
    policy: Policy
    upstream: UpstreamSpec
    boundary: str = "session"
    observe: bool = False
    emit_policy: Path | None = None
    call_timeout: float = 120.0
    lease_ttl: float = 30.0
    saga_name: str = "mcp"
    listen_token: str = ""  # over HTTP: clients must send `Authorization: Bearer <it>` (when set)
    session_idle: float = 1800.0  # over HTTP: a session silent this long was dropped (a crash)


def error_result(message: str, data: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], structured_content=data, is_error=True
    )


def _annotated(tool: types.Tool, semantics: Semantics) -> types.Tool:
    hints = (tool.annotations or types.ToolAnnotations()).model_copy(
        update={"read_only_hint": semantics is PREVIEW, "destructive_hint": semantics is IRREVERSIBLE}
    )
    return tool.model_copy(
        update={"annotations": hints, "meta": {**(tool.meta or {}), SEMANTICS_META: semantics.value}}
    )


SAGA_TOOLS = [
    types.Tool(
        name=COMMIT,
        description="Finish the current unit of work: its effects stand. Later calls start a new one.",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False),
    ),
    types.Tool(
        name=ROLLBACK,
        description="Undo every effect of the current unit of work, newest first, where the policy "
        "knows how. Reports what could not be undone.",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
    ),
]


class _Sagas:
    """The open sagas: each client session's own (stdio has one session; over HTTP, each
    `Mcp-Session-Id`), and any saga a client named in `_meta`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.open: dict[str, Saga] = {}
        self.closed: set[str] = set()
        self.default: dict[str, str] = {}  # client session -> its saga id
        self.seen: dict[str, float] = {}  # client session -> when it last called a tool
        self._lock = anyio.Lock()

    def _new(self, saga_id: str | None) -> Saga:
        config = self.gateway.config
        return Saga(config.saga_name, wal=self.gateway.wal, saga_id=saga_id, lease_ttl=config.lease_ttl)

    async def get(self, saga_id: str | None, session: str = "") -> Saga:
        async with self._lock:
            key = saga_id or (None if self.gateway.config.boundary == "none" else self.default.get(session))
            if key is not None and key in self.open:
                return self.open[key]
            if saga_id is not None and saga_id in self.closed:
                raise core.Refused("saga_closed", "", {"message": f"saga {saga_id} is already finished"})
            saga = self._new(saga_id)
            await saga.__aenter__()
            self.open[saga.saga_id] = saga
            if saga_id is None and self.gateway.config.boundary != "none":
                self.default[session] = saga.saga_id
            return saga

    async def finish(
        self, saga_id: str | None, *, rollback: bool, session: str = ""
    ) -> tuple[str, RollbackReport | None]:
        async with self._lock:
            key = saga_id or self.default.get(session)
            saga = self.open.pop(key, None) if key else None
            if key is not None and self.default.get(session) == key:
                del self.default[session]
        if saga is None:
            return "", None
        self.closed.add(saga.saga_id)
        report = await saga.rollback_async() if rollback else None
        await saga.__aexit__(None, None, None)
        return saga.saga_id, report

    async def drop_idle(self, idle: float) -> list[str]:
        """HTTP sessions silent for `idle` seconds were dropped, not ended: their sagas are left
        to recovery (the lease is no longer renewed; no terminal record is written)."""
        now = anyio.current_time()
        dropped = []
        async with self._lock:
            for session, seen in list(self.seen.items()):
                if now - seen < idle:
                    continue
                del self.seen[session]
                saga = self.open.pop(self.default.pop(session, ""), None)
                if saga is not None:
                    saga.wal.release_lease(saga.saga_id)
                    self.closed.add(saga.saga_id)
                    dropped.append(saga.saga_id)
        return dropped

    async def end_session(self, session: str) -> None:
        """The client ended its session: its saga is complete."""
        self.seen.pop(session, None)
        if session in self.default:
            await self.finish(None, rollback=False, session=session)

    async def close_all(self) -> None:
        for saga_id in list(self.open):
            await self.finish(saga_id, rollback=False)


class _GatewayServer(Server[Any]):
    """A low-level server whose capabilities are the upstream's (plus tools)."""

    gateway: Gateway

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        upstream = self.gateway.upstream
        theirs = upstream.server_capabilities if upstream is not None else None
        caps = theirs.model_copy() if theirs is not None else types.ServerCapabilities()
        if caps.tools is None:
            caps.tools = types.ToolsCapability(list_changed=False)
        return caps


@dataclass
class Gateway:
    config: GatewayConfig
    wal: WAL
    upstream: ClientSession | None = None
    downstream: ServerSession | None = None
    seen: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.governor = core.Governor(
            self.config.policy, view_result=result_view, is_error=is_error, capture=self._capture
        )
        self.sagas = _Sagas(self)

    # -- the upstream -------------------------------------------------------------------------

    def session_kwargs(self) -> dict[str, Any]:
        return {
            "sampling_callback": self._sampling,
            "elicitation_callback": self._elicitation,
            "message_handler": self._from_upstream,
        }

    def _up(self) -> ClientSession:
        if self.upstream is None:
            raise MCPError(code=types.INTERNAL_ERROR, message="the upstream server is not connected")
        return self.upstream

    async def _capture(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        result = await self._up().call_tool(tool, arguments, read_timeout_seconds=self.config.call_timeout)
        assert isinstance(result, types.CallToolResult)
        return result

    async def run_tool(self, tool: str, arguments: dict[str, Any], key: str | None = None) -> Any:
        """A compensation, through the upstream (registered by `core.register_compensators`)."""
        meta = {IDEMPOTENCY_META: key} if key else None
        result = await self._up().call_tool(
            tool, arguments, read_timeout_seconds=self.config.call_timeout, meta=cast(Any, meta)
        )
        if is_error(result):
            raise RuntimeError(f"{tool} answered with an error: {text_of(cast(Any, result))[:500]}")
        return result_view(result)

    async def _sampling(self, context: ClientRequestContext, params: Any) -> Any:
        downstream = self.downstream
        if downstream is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message="no client to ask")
        request = types.CreateMessageRequest(params=params)
        return await downstream.send_request(cast(Any, request), types.CreateMessageResult)

    async def _elicitation(self, context: ClientRequestContext, params: Any) -> Any:
        downstream = self.downstream
        if downstream is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message="no client to ask")
        request = types.ElicitRequest(params=params)
        return await downstream.send_request(cast(Any, request), types.ElicitResult)

    async def _from_upstream(self, message: Any) -> None:
        if isinstance(message, Exception):
            logger.warning("upstream transport: %r", message)
            return
        if self.downstream is not None:
            with contextlib.suppress(Exception):
                await self.downstream.send_notification(message)

    # -- the server ---------------------------------------------------------------------------

    def server(self) -> Server[Any]:
        server = _GatewayServer(
            f"sagaplane-gateway ({self.config.policy.name})",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )
        server.gateway = self
        server.middleware = [self._passthrough]
        return server

    async def _passthrough(self, ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        """Every message but the gateway's own goes to the upstream unchanged."""
        if ctx.method not in LOCAL_METHODS and ctx.method not in LOCAL_NOTIFICATIONS:
            self.downstream = ctx.session
            params = dict(ctx.params) if ctx.params is not None else None
            if ctx.request_id is None:
                await self._up().send_notification(cast(Any, _Notification(method=ctx.method, params=params)))
                return None
            return await self._up().send_request(
                cast(Any, _Request(method=ctx.method, params=params)),
                _ANY,
                request_read_timeout_seconds=self.config.call_timeout,
            )
        return await call_next(ctx)

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self.downstream = ctx.session
        listed = await self._up().list_tools(params=params)
        tools = []
        for tool in listed.tools:
            if self.config.observe:
                self._observed(tool.name, tool.description or "")
            rule = self.governor.rule(tool.name)
            if rule is not None:
                tools.append(_annotated(tool, rule.semantics))
        if self.config.boundary == "explicit" and not listed.next_cursor:
            tools.extend(SAGA_TOOLS)
        return listed.model_copy(update={"tools": tools})

    def _observed(self, tool: str, description: str) -> None:
        if tool in self.seen and (self.seen[tool] or not description):
            return
        self.seen[tool] = description
        target = self.config.emit_policy
        if target is None:
            return
        text = skeleton(self.config.policy.name, self.seen.items())
        partial = target.with_name(target.name + ".partial")
        partial.write_text(text)
        os.replace(partial, target)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        self.downstream = ctx.session
        name, arguments = params.name, dict(params.arguments or {})
        meta = dict(params.meta or {})
        requested = meta.get(SAGA_META)
        saga_id = requested if isinstance(requested, str) and 0 < len(requested) <= 128 else None
        client = _session_key(ctx)
        self.sagas.seen[client] = anyio.current_time()
        if self.config.boundary == "explicit" and name in (COMMIT, ROLLBACK):
            return await self._boundary_tool(name, saga_id, client)
        if self.config.observe:
            self._observed(name, self.seen.get(name, ""))
        progress = _Progress(ctx, meta)
        saga: Saga | None = None
        try:
            saga = await self.sagas.get(saga_id, client)
            try:
                result = await self._governed(saga, name, arguments, meta, progress, ctx)
            finally:
                if self.config.boundary == "none":  # one call, one saga, completed at once
                    with anyio.CancelScope(shield=True):
                        await self.sagas.finish(saga.saga_id, rollback=False)
        except core.Refused as refused:
            refused.tool = refused.tool or name
            return error_result(refused.message, refused.payload())
        except MCPError as exc:
            if exc.code in (types.REQUEST_TIMEOUT, types.CONNECTION_CLOSED) or exc.message.startswith(
                OVERSIZED
            ):
                return self._unknown(name, saga, exc)
            raise  # the upstream's own JSON-RPC error, passed through
        except Exception as exc:  # the upstream broke mid-call: the outcome is unknown
            return self._unknown(name, saga, exc)
        return result.model_copy(update={"meta": {**(result.meta or {}), SAGA_META: saga.saga_id}})

    async def _governed(
        self,
        saga: Saga,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any],
        progress: _Progress,
        ctx: ServerRequestContext[Any, Any],
    ) -> types.CallToolResult:
        forwarded = {k: v for k, v in meta.items() if k != SAGA_META and k != IDEMPOTENCY_META}

        async def perform(resolved: dict[str, Any] | None = None) -> Any:
            # `resolved`: the arguments with the policy's `secret` ones resolved for this attempt.
            return await self._up().call_tool(
                name,
                arguments if resolved is None else resolved,
                read_timeout_seconds=self.config.call_timeout,
                progress_callback=progress.forward if progress.token is not None else None,
                meta=cast(Any, forwarded or None),
            )

        result = await self.governor.call(
            saga, name, arguments, perform, call_id=str(ctx.request_id or ""), on_pending=progress.pending
        )
        if not isinstance(result, types.CallToolResult):
            raise MCPError(code=types.INTERNAL_ERROR, message="the upstream gave no tool result")
        return result

    def _unknown(self, tool: str, saga: Saga | None, exc: BaseException) -> types.CallToolResult:
        saga_id = saga.saga_id if saga is not None else None
        message = (
            f"The tool {tool} did not answer in time or its server failed ({exc}). Whether it took effect "
            "is unknown; do not simply retry it. The unit of work will be checked and undone where possible."
        )
        return error_result(message, {"reason": "outcome_unknown", "tool": tool, "saga_id": saga_id})

    async def _boundary_tool(self, name: str, saga_id: str | None, client: str) -> types.CallToolResult:
        finished, report = await self.sagas.finish(saga_id, rollback=name == ROLLBACK, session=client)
        if not finished:
            data: dict[str, Any] = {"saga_id": None, "outcome": "nothing to finish"}
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="Nothing was open.")], structured_content=data
            )
        if report is None:
            text, data = f"Committed {finished}.", {"saga_id": finished, "outcome": "committed"}
        else:
            data = {
                "saga_id": finished,
                "outcome": "rolled_back" if report.clean else "partial",
                "compensated": [s.tool for s in report.compensated],
                "failed": [s.tool for s in report.failed],
                "orphaned": [s.tool for s in report.orphaned],
            }
            text = report.summary()
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=data,
            is_error=bool(report and not report.clean),
        )


class _Progress:
    """Progress notifications for one call: the upstream's, and the gateway's own while an
    approval is pending (only when the client asked for progress with a token)."""

    def __init__(self, ctx: ServerRequestContext[Any, Any], meta: dict[str, Any]) -> None:
        self.ctx = ctx
        self.token = meta.get("progressToken", meta.get("progress_token"))
        self.count = 0.0

    async def _send(self, progress: float, total: float | None, message: str | None) -> None:
        if self.token is None:
            return
        self.count = max(self.count + 1, progress)
        note = types.ProgressNotification(
            params=types.ProgressNotificationParams(
                progress_token=self.token, progress=self.count, total=total, message=message
            )
        )
        with contextlib.suppress(Exception):
            await self.ctx.session.send_notification(note, related_request_id=self.ctx.request_id)

    async def forward(self, progress: float, total: float | None, message: str | None) -> None:
        await self._send(progress, total, message)

    async def pending(self, info: dict[str, Any]) -> None:
        left = info.get("seconds_left")
        await self._send(
            0,
            None,
            f"waiting for approval {info.get('approval_id')} of {info.get('tool')} ({left:.0f} s left)",
        )


def _session_key(ctx: ServerRequestContext[Any, Any]) -> str:
    """The client session a request belongs to: its Mcp-Session-Id over HTTP, "" on stdio."""
    headers = getattr(ctx.request, "headers", None)
    return str(headers.get("mcp-session-id") or "") if headers is not None else ""


async def serve(gateway: Gateway, listen: tuple[str, int] | None) -> None:
    """Connect to the upstream and serve the client (stdio, or streamable HTTP on `listen`) until
    the client ends the session or the gateway is asked to stop (SIGTERM, SIGINT); then complete
    the open sagas. Only a gateway that dies without that (SIGKILL) leaves them to recovery."""
    async with contextlib.AsyncExitStack() as stack:
        upstream = await _connect(stack, gateway)
        gateway.upstream = upstream
        core.register_compensators(gateway.config.policy, gateway.run_tool)
        server = gateway.server()
        try:
            async with anyio.create_task_group() as tg:
                if listen is None:
                    tg.start_soon(_stop_on_signal, tg.cancel_scope.cancel)
                    from mcp.server.stdio import stdio_server

                    async with stdio_server() as (read, write):
                        await server.run(read, write, server.create_initialization_options())
                else:
                    http = _http_server(gateway, server, listen)
                    tg.start_soon(_stop_on_signal, lambda: setattr(http, "should_exit", True))
                    tg.start_soon(_drop_idle_sessions, gateway)
                    await http.serve()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await gateway.sagas.close_all()


async def _connect(stack: contextlib.AsyncExitStack, gateway: Gateway) -> ClientSession:
    """The upstream session; an upstream URL still starting is tried again for CONNECT_DEADLINE_S."""
    deadline = anyio.current_time() + CONNECT_DEADLINE_S
    while True:
        try:
            return await stack.enter_async_context(
                connect(gateway.config.upstream, **gateway.session_kwargs())
            )
        except Exception as exc:
            if not gateway.config.upstream.url or anyio.current_time() > deadline:
                raise  # a command that fails to start fails at once
            logger.warning("upstream %s not reachable yet: %r", gateway.config.upstream.describe(), exc)
            await anyio.sleep(1.0)


async def _drop_idle_sessions(gateway: Gateway) -> None:
    idle = gateway.config.session_idle
    while True:
        await anyio.sleep(max(0.2, min(idle / 4, 30.0)))
        for saga_id in await gateway.sagas.drop_idle(idle):
            logger.warning("saga %s: its HTTP session went silent; left to recovery", saga_id)


async def _stop_on_signal(stop: Callable[[], Any]) -> None:
    import signal

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop()
            return


def _http_server(gateway: Gateway, server: Server[Any], listen: tuple[str, int]) -> Any:
    """uvicorn serving the streamable HTTP app; a DELETE of a session completes its saga."""
    import uvicorn

    host, port = listen
    app = server.streamable_http_app(host=host)

    token = gateway.config.listen_token.encode()

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if token and scope.get("type") == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, b"Bearer " + token):
                body = b'{"error": "unauthorized", "detail": "Authorization: Bearer <the gateway token>"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)
        if scope.get("type") == "http" and scope.get("method") == "DELETE":
            headers = dict(scope.get("headers") or [])
            session = headers.get(b"mcp-session-id", b"").decode("latin-1")
            if session:
                await gateway.sagas.end_session(session)

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:  # the gateway handles SIGTERM / SIGINT itself
            yield

    return _Server(uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on"))
