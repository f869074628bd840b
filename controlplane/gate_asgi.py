"""`POST /api/v1/gate/evaluate` without Django's request stack, for the calls that need none of it.

Every agent asks the gate before every governed effect, so this one route is answered in front of
Django's ASGI handler, middleware and DRF (most of a request's CPU time). It is a fast route
(tenants/fastroute.py, shared with the proofs' transparency/lean.py): whether the call is plain
(Django's own host and https checks), the key (`verify_api_key`, the DRF authentication class's
check: a per-process copy checked against the tenant's epoch) and the access rule the route table
declares for the route (`GateEvaluateView.access`) are decided there; here the body is read, parsed
strictly and read by `fleet.calls.gate_call` (the view's own reading), and `fleet.services.evaluate`
decides, with the epoch the key check read, so one cache GET serves both.

Only a call with nothing unusual about it is answered here; anything else is handed, untouched
(its body replayed), to the full stack, which answers it exactly as before: a host not allowed, a
plain-http request where https is required, a query parameter, a repeated header, a body that is
not a JSON object of at most SAGAPLANE_MAX_BODY_BYTES with a declared length, a key that fails
verification or that the route's rule refuses, a field the view would refuse, a process whose
database role is not yet verified (core.rls.RuntimeRoleGuardMiddleware). The answer's headers
are those Django gave this route's last successful answer to a call of the same class, https or
not (`tenants.fastroute.HEADERS`, security headers included): until one was seen, every call of that
class goes through Django. Once `evaluate` has started, nothing is handed on (a decision is taken
once); an error after it is a 500 in the API's error shape. The request id, the request's log line
and the gate metrics are kept as the observability middleware keeps them.

While the database or Redis cannot be reached, every call is answered here, 503
`control_plane_unavailable`, within a second (`core.availability`): at once while the
store is known to be down, else once the call meets the outage (its wait for a pooled connection
bounded); handing such a call on would only make the full stack meet it again, slowly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from django.conf import settings
from django.db import close_old_connections, connection
from django.http import HttpRequest, QueryDict

from core.numbers import ascii_int
from tenants import fastroute
from tenants.actors import api_key_actor

log = logging.getLogger(__name__)

PATH = "/api/v1/gate/evaluate"  # the route table's `gate-evaluate` (tests check they agree)
ROUTE = fastroute.FastRoute("gate-evaluate", "POST")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
_NO_QUERY = QueryDict()


class _HandOn(Exception):
    """This call is the full stack's to answer."""


class _ScopeRequest(HttpRequest):
    """The call's scope as Django reads a request's method, path, query, host and scheme: what
    `tenants.fastroute` asks of it, answered by Django's own code (`get_host`, `is_secure`). Only
    those are set (HttpRequest's own __init__, its empty body and cookies, would cost more than
    the checks)."""

    def __init__(self, scope: Scope, headers: dict[bytes, bytes]) -> None:  # not HttpRequest.__init__
        self.method = scope.get("method")
        self.path = self.path_info = scope.get("path", "")
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        server = scope.get("server") or ("", "")
        self.META = {
            "HTTP_" + name.decode("latin-1").upper().replace("-", "_"): value.decode("latin-1")
            for name, value in headers.items()
        }
        self.META.update(QUERY_STRING=query, SERVER_NAME=str(server[0]), SERVER_PORT=str(server[1]))
        self.GET = QueryDict(query) if query else _NO_QUERY
        self._scheme = str(scope.get("scheme") or "http")

    def _get_scheme(self) -> str:
        return self._scheme


class LeanGate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # As many threads as a process has pooled database connections: no call waits for one.
        self.executor = ThreadPoolExecutor(
            max_workers=getattr(settings, "DB_POOL_MAX_SIZE", 4), thread_name_prefix="lean-gate"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            headers = _headers(scope)
            raw_key, declared, learned = _eligible(scope, headers)
        except _HandOn:
            await self.app(scope, receive, send)
            return
        body, chunks, complete = await _read_body(receive, declared)
        if not complete:
            await self.app(scope, _replay(chunks, receive), send)
            return
        request_id = _request_id(headers)
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self.executor, _decide, raw_key, body, request_id)
        if answer is None:
            await self.app(scope, _replay(chunks, receive), send)
            return
        status, payload, tenant, actor = answer
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    *learned.raw,
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-request-id", request_id.encode()),
                    *([(b"retry-after", b"1")] if status == 503 else []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        _observe(status, payload, time.perf_counter() - started, tenant, actor, request_id)


def _eligible(scope: Scope, headers: dict[bytes, bytes]) -> tuple[str, int, fastroute.Learned]:
    """The API key, declared body length and learned headers of a call this path may answer
    (else _HandOn)."""
    request = _ScopeRequest(scope, headers)
    raw_key = fastroute.plain_key(request, ROUTE)
    learned = fastroute.HEADERS.get(ROUTE, request.is_secure())
    if raw_key is None or learned is None:
        raise _HandOn  # not plain, or not yet seen: the next answer teaches the headers (`learning`)
    if scope.get("query_string"):
        raise _HandOn  # not even an empty parameter (the route's declared parameters: none)
    declared = ascii_int(headers.get(b"content-length", b"").decode("latin-1"))
    if declared is None or declared > settings.SAGAPLANE_MAX_BODY_BYTES:
        raise _HandOn
    if headers.get(b"content-type", b"").split(b";")[0].strip() != b"application/json":
        raise _HandOn
    return raw_key, declared, learned


def learning(app: ASGIApp) -> ASGIApp:
    """`app` (the full stack), noting the headers of this route's successful answers, per request
    class (`tenants.fastroute.HEADERS`)."""

    async def noting_answers(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH or scope.get("method") != "POST":
            await app(scope, receive, send)
            return
        try:
            secure = _ScopeRequest(scope, _headers(scope)).is_secure()
        except _HandOn:
            await app(scope, receive, send)  # a repeated header: not a call this path answers
            return

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start" and message.get("status") == 200:
                headers = [
                    (bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
                    for name, value in message.get("headers", [])
                ]
                fastroute.HEADERS.learn(ROUTE, secure, headers)
            await send(message)

        await app(scope, receive, noting)

    return noting_answers


def lean_gate(app: ASGIApp) -> LeanGate:
    """The ASGI application: this route's lean path in front of `app` (Django's)."""
    return LeanGate(learning(app))


def _headers(scope: Scope) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", []):
        name = bytes(name).lower()
        if name in found:
            raise _HandOn  # a repeated header: the full stack's rules decide which counts
        found[name] = bytes(value)
    return found


def _request_id(headers: dict[bytes, bytes]) -> str:
    from controlplane.observability import new_request_id

    return new_request_id(headers.get(b"x-request-id", b"").decode("latin-1"))


async def _read_body(receive: Receive, declared: int) -> tuple[bytes, list[Message], bool]:
    """The body (at most `declared` bytes), the messages read, and whether it is complete as
    declared (else the full stack answers it, from the replayed messages)."""
    chunks: list[Message] = []
    size = 0
    while True:
        message = await receive()
        chunks.append(message)
        if message["type"] != "http.request":
            return b"", chunks, False
        size += len(message.get("body", b""))
        if size > declared:
            return b"", chunks, False
        if not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in chunks)
    return body, chunks, size == declared


def _replay(chunks: list[Message], receive: Receive) -> Receive:
    pending = list(chunks)

    async def replaying() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replaying


def _decide(raw_key: str, body: bytes, request_id: str) -> tuple[int, bytes, str, str] | None:
    """In a worker thread: (status, JSON, tenant slug, actor), or None to hand the call on."""
    close_old_connections()
    # Bound and reset by token: `bound_contextvars` would copy the thread's whole context first.
    bound = structlog.contextvars.bind_contextvars(request_id=request_id)
    try:
        return _answer(raw_key, body)
    finally:
        structlog.contextvars.reset_contextvars(**bound)
        connection.close()  # back to the pool, as at the end of a Django request


def _answer(raw_key: str, body: bytes) -> tuple[int, bytes, str, str] | None:
    from core import availability

    try:
        availability.guard()  # a store known to be down: refused at once, nothing read
        with availability.connection_wait():
            return _decided(raw_key, body)
    except availability.Unavailable as refused:
        return _unavailable(refused)


def _decided(raw_key: str, body: bytes) -> tuple[int, bytes, str, str] | None:
    from rest_framework.exceptions import APIException

    from controlplane.parsers import check_storable, strict_loads
    from core import availability
    from core.errors import DomainError
    from core.scoping import tenant_statements
    from fleet import services
    from fleet.calls import gate_call

    try:
        caller = fastroute.admitted(raw_key, ROUTE)
        if caller is None:
            return None
        api_key, tenant, version = caller
        data = strict_loads(body.decode("utf-8"))
        check_storable(data)
        if not isinstance(data, dict):
            return None
        call = gate_call(data, api_key.prefix)
    except (APIException, DomainError, ValueError, RecursionError, UnicodeDecodeError):
        return None
    except Exception as exc:
        refused = availability.failed(exc)
        if refused is not None:
            raise refused from exc
        # Nothing is decided yet: the full stack answers the call (and meets the same fault).
        log.warning("lean gate: handing a call on after an error", exc_info=True)
        return None
    caller_actor = api_key_actor(api_key.prefix)
    actor = str(caller_actor)  # as the request log names it
    try:
        # The transport enters the tenant, statement-scoped: no transaction, so the decision takes
        # its lean path (each statement carries the tenant; a read that needs one opens it).
        with tenant_statements(tenant):
            answer = services.evaluate(tenant, call, actor=caller_actor, version=version)
        payload = json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        return 200, payload, tenant.slug, actor
    except availability.Unavailable as refusal:
        return (*_unavailable(refusal)[:2], tenant.slug, actor)
    except Exception as exc:
        outage = availability.failed(exc)
        if outage is not None:
            return (*_unavailable(outage)[:2], tenant.slug, actor)
        log.exception("unhandled error on POST %s", PATH)
        error = {"error": "server_error", "detail": "an internal error occurred; it has been logged"}
        return 500, json.dumps(error, separators=(",", ":")).encode(), tenant.slug, actor


def _unavailable(refused: Exception) -> tuple[int, bytes, str, str]:
    """503 `control_plane_unavailable` in the error shape (`core.availability`)."""
    from core.errors import DomainError

    assert isinstance(refused, DomainError)
    return refused.status, json.dumps(refused.body(), separators=(",", ":")).encode(), "", ""


def _observe(status: int, payload: bytes, seconds: float, tenant: str, actor: str, request_id: str) -> None:
    from controlplane.observability import log_request, record_gate_answer

    try:
        data = json.loads(payload)
        record_gate_answer(status, data if isinstance(data, dict) else {})
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            log_request("POST", PATH, ROUTE.url_name, status, seconds, tenant=tenant, actor=actor)
    except Exception:  # observing must never change an answer (it has been sent)
        log.exception("observing the request failed")
