"""Inclusion and consistency proofs without the rest of Django's request stack, for the calls that
need none of it.

A proof is one SQL statement (transparency.proofs), so at 1M leaves most of a proof request's
time was the stack around it: the session, CSRF, auth, messages, frame, CSP and axes middleware,
then DRF's request, authentication, content negotiation and response. This middleware sits inside
the request id and log line (controlplane.observability), the security headers and SSL redirect
(SecurityMiddleware), the database role guard and the error shape (core.errors), and
answers a plain proof GET itself, with the views' own code (`InclusionProofView.answer`,
`ConsistencyProofView.answer`) under the views' own tenant scope.

Each proof route is a fast route (tenants/fastroute.py, shared with the gate's
controlplane/gate_asgi.py), which decides what both must decide alike: whether the call is plain
(database role verified, host allowed, no query parameter the view does not read, `format`
included), the key (`verify_api_key`, the DRF authentication class's check: malformed, unknown,
wrong, revoked or expired) and the access rule the route table declares for the route and method.
On top of those, a proof call is handed on when its `Accept` could choose another renderer than
JSON, or it carries a cookie or a body; and so is any refusal or error of the proof itself.
Everything handed on goes, untouched, to the full stack, which answers as before (in the error
shape). The answer's bytes are DRF's JSON renderer's; its headers are those the full stack gave the
route's last successful answer to a call of the same class, https or not
(`tenants.fastroute.HEADERS`): until one was seen, every call of that class goes through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from django.http import HttpRequest, HttpResponse
from rest_framework.renderers import JSONRenderer

from core.actors import Actor
from core.scoping import tenant_context, tenant_statements
from tenants import fastroute
from tenants.actors import api_key_actor
from tenants.models import ApiKey, Tenant

_JSON_ACCEPTS = {"", "*/*", "application/json"}


# Answered by their views' `answer` (InclusionProofView, ConsistencyProofView), found by the route table.
PROOFS = (
    fastroute.FastRoute("audit-proof-inclusion", "GET", frozenset({"index", "size"})),
    fastroute.FastRoute("audit-proof-consistency", "GET", frozenset({"first", "second"})),
)


@cache
def _proofs() -> dict[str, fastroute.FastRoute]:
    return {route.path: route for route in PROOFS}


@dataclass(frozen=True)
class _Answered:
    """What the request's log line reads from the view that answered (observability)."""

    tenant: Tenant
    actor: Actor


class LeanProofMiddleware:
    _renderer: ClassVar[JSONRenderer] = JSONRenderer()

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        route = _proofs().get(request.path_info) if request.method == "GET" else None
        raw_key = _plain_call(request, route) if route is not None else None
        if route is None or raw_key is None:
            return self.get_response(request)
        secure = request.is_secure()
        learned = fastroute.HEADERS.get(route, secure)
        if learned is not None:
            answered = _answer(request.GET, route, raw_key)
            if answered is not None:
                return self._respond(request, route, learned, *answered)
        response = self.get_response(request)
        if response.status_code == 200 and not response.streaming:
            fastroute.HEADERS.learn(route, secure, response.items())
        return response

    def _respond(
        self,
        request: HttpRequest,
        route: fastroute.FastRoute,
        learned: fastroute.Learned,
        data: dict[str, Any],
        api_key: ApiKey,
        tenant: Tenant,
    ) -> HttpResponse:
        body = self._renderer.render(data)
        response = HttpResponse(body)
        for name, value in learned.items:
            response[name] = value
        response["Content-Length"] = str(len(body))
        request.resolver_match = route.match
        response.renderer_context = {"view": _Answered(tenant, api_key_actor(api_key.prefix))}  # type: ignore[attr-defined]
        return response


def _plain_call(request: HttpRequest, route: fastroute.FastRoute) -> str | None:
    """The presented API key when the call is one the lean path may answer; else None."""
    meta = request.META
    if meta.get("HTTP_COOKIE") or meta.get("CONTENT_LENGTH") not in (None, "", "0"):
        return None
    if meta.get("HTTP_ACCEPT", "").strip() not in _JSON_ACCEPTS:
        return None
    return fastroute.plain_key(request, route)


def _answer(
    query: Mapping[str, str], route: fastroute.FastRoute, raw_key: str
) -> tuple[dict[str, Any], ApiKey, Tenant] | None:
    caller = fastroute.admitted(raw_key, route)
    if caller is None:
        return None  # the full stack refuses it, in its words
    api_key, tenant, _version = caller
    scope = tenant_statements if route.view.statement_scoped else tenant_context
    try:
        with scope(tenant):
            return route.view.answer(query), api_key, tenant
    except Exception:  # a refusal or an error: the full stack answers it, in its words
        return None
