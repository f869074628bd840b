"""`POST /api/v1/gate/evaluate` without Django's request stack, for the calls that need none of it.

Every agent asks the gate before every governed effect, so this one route is answered in front of
Django's ASGI handler, middleware and DRF (most of a request's CPU time): the body is read, the
API key verified (`tenants.authentication.verify_api_key`: a per-process copy checked against the
tenant's epoch), the body parsed strictly and read by `fleet.calls.gate_call` (the view's own
reading), and `fleet.services.evaluate` decides — with the epoch the key check read, so one cache
GET serves both.

Only a call with nothing unusual about it is answered here; anything else is handed, untouched
(its body replayed), to the full stack, which answers it exactly as before: a host not allowed, a
plain-http request where https is required, a query string, a body that is not a JSON object of
at most SAGAPLANE_MAX_BODY_BYTES with a declared length, a key that fails verification or lacks
the `gate` scope, a field the view would refuse, a process whose database role is not yet verified
(tenants.rls.RuntimeRoleGuardMiddleware). The answer's headers are those Django gave this route's
last successful answer (security headers included): until one was seen, every call goes through
Django. Once `evaluate` has started, nothing is handed on (a decision is taken once); an error
after it is a 500 in the API's error shape. The request id, the request's log line and the
gate metrics are kept as the observability middleware keeps them.

While the database or Redis cannot be reached, every call is answered here, 503
`control_plane_unavailable`, within a second (`controlplane.availability`): at once while the
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
from django.http.request import split_domain_port, validate_host

from controlplane.numbers import ascii_int
from tenants.actors import api_key_actor

log = logging.getLogger(__name__)

PATH = "/api/v1/gate/evaluate"
ROUTE = "gate-evaluate"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
# Headers of Django's answer that are not the route's own (set per answer, or never reused).
_PER_ANSWER = {b"content-length", b"x-request-id", b"date", b"server", b"set-cookie"}


class _HandOn(Exception):
    """This call is the full stack's to answer."""


class LeanGate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers: list[tuple[bytes, bytes]] | None = None
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
            raw_key, declared = self._eligible(scope, headers)
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
        assert self.headers is not None
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    *self.headers,
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-request-id", request_id.encode()),
                    *([(b"retry-after", b"1")] if status == 503 else []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        _observe(status, payload, time.perf_counter() - started, tenant, actor, request_id)

    def _eligible(self, scope: Scope, headers: dict[bytes, bytes]) -> tuple[str, int]:
        """The API key and declared body length of a call this path may answer (else _HandOn)."""
        from tenants.rls import RuntimeRoleGuardMiddleware

        if self.headers is None:
            raise _HandOn  # not yet seen: the next answer teaches the headers (see `learn`)
        if not RuntimeRoleGuardMiddleware.verified or scope.get("query_string"):
            raise _HandOn
        if not _host_allowed(headers.get(b"host", b"").decode("latin-1")):
            raise _HandOn
        if settings.SECURE_SSL_REDIRECT and not _secure(scope, headers):
            raise _HandOn
        declared = ascii_int(headers.get(b"content-length", b"").decode("latin-1"))
        if declared is None or declared > settings.SAGAPLANE_MAX_BODY_BYTES:
            raise _HandOn
        if headers.get(b"content-type", b"").split(b";")[0].strip() != b"application/json":
            raise _HandOn
        scheme, _, raw_key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme != "Bearer" or not raw_key.strip():
            raise _HandOn
        return raw_key.strip(), declared

    def learn(self, app: ASGIApp) -> ASGIApp:
        """`app` (the full stack), noting the headers of this route's successful answers."""

        async def learning(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or scope.get("path") != PATH or self.headers is not None:
                await app(scope, receive, send)
                return

            async def noting(message: Message) -> None:
                if message["type"] == "http.response.start" and message.get("status") == 200:
                    self.headers = [
                        (bytes(name).lower(), bytes(value))
                        for name, value in message.get("headers", [])
                        if bytes(name).lower() not in _PER_ANSWER
                    ]
                await send(message)

            await app(scope, receive, noting)

        return learning


def lean_gate(app: ASGIApp) -> LeanGate:
    """The ASGI application: this route's lean path in front of `app` (Django's)."""
    gate = LeanGate(app)
    gate.app = gate.learn(app)
    return gate


def _headers(scope: Scope) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", []):
        name = bytes(name).lower()
        if name in found:
            raise _HandOn  # a repeated header: the full stack's rules decide which counts
        found[name] = bytes(value)
    return found


def _host_allowed(host: str) -> bool:
    if settings.USE_X_FORWARDED_HOST:
        return False  # the full stack reads the forwarded host
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


def _secure(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    if scope.get("scheme") == "https":
        return True
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if not proxy:
        return False
    name, value = proxy
    header = name.removeprefix("HTTP_").replace("_", "-").lower().encode()
    return headers.get(header, b"").decode("latin-1").split(",")[0].strip() == value


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
    try:
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            return _answer(raw_key, body)
    finally:
        connection.close()  # back to the pool, as at the end of a Django request


def _answer(raw_key: str, body: bytes) -> tuple[int, bytes, str, str] | None:
    from controlplane import availability

    try:
        availability.guard()  # a store known to be down: refused at once, nothing read
        with availability.connection_wait():
            return _decided(raw_key, body)
    except availability.Unavailable as refused:
        return _unavailable(refused)


def _decided(raw_key: str, body: bytes) -> tuple[int, bytes, str, str] | None:
    from rest_framework.exceptions import APIException

    from controlplane import availability
    from controlplane.errors import DomainError
    from controlplane.parsers import check_storable, strict_loads
    from fleet import services
    from fleet.calls import gate_call
    from tenants import access
    from tenants.authentication import verify_api_key

    try:
        api_key, tenant, version = verify_api_key(raw_key)
        if access.decide(access.GATE, api_key=api_key) is not None:
            return None
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
    actor = api_key_actor(api_key.prefix)
    try:
        answer = services.evaluate(tenant, call, actor=actor, version=version)
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
    """503 `control_plane_unavailable` in the error shape (`controlplane.availability`)."""
    from controlplane.errors import DomainError

    assert isinstance(refused, DomainError)
    return refused.status, json.dumps(refused.body(), separators=(",", ":")).encode(), "", ""


def _observe(status: int, payload: bytes, seconds: float, tenant: str, actor: str, request_id: str) -> None:
    from controlplane.observability import log_request, record_gate_answer

    try:
        data = json.loads(payload)
        record_gate_answer(status, data if isinstance(data, dict) else {})
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            log_request("POST", PATH, ROUTE, status, seconds, tenant=tenant, actor=actor)
    except Exception:  # observing must never change an answer (it has been sent)
        log.exception("observing the request failed")
