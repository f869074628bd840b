"""Inclusion and consistency proofs without the rest of Django's request stack, for the calls that
need none of it.

A proof is one SQL statement (transparency.proofs), so at 1M leaves most of a proof request's
time was the stack around it: the session, CSRF, auth, messages, frame, CSP and axes middleware,
then DRF's request, authentication, content negotiation and response. This middleware sits inside
the request id and log line (controlplane.observability), the database role guard and the error
shape (controlplane.errors), and answers a plain proof GET itself, with the views' own code
(`InclusionProofView.answer`, `ConsistencyProofView.answer`) under the views' own tenant scope.

It answers only what it can answer exactly as the full stack would, and hands everything else on,
untouched, to the full stack, which answers as before: a method other than GET, a host not
allowed, a query with any
parameter the view does not read (`format` included), an `Accept` that could choose another
renderer than JSON, a cookie, a body, a key that does not verify (`tenants.authentication.verify_api_key`,
the one check every path makes: malformed, unknown, wrong, revoked or expired), a key the route's
rule refuses, and any refusal or error of the proof itself (the full stack words it in the
error shape). The answer's bytes are DRF's JSON renderer's; its headers are those the full stack
gave the route's last successful answer (until one was seen, every call goes through it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.urls import ResolverMatch, reverse
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.renderers import JSONRenderer

from tenants import access as policy
from tenants.actors import api_key_actor
from tenants.authentication import verify_api_key
from tenants.models import ApiKey, Tenant
from tenants.scoping import tenant_context, tenant_statements
from transparency.api import ConsistencyProofView, InclusionProofView

# Headers of the full stack's answer that belong to that answer only.
_PER_ANSWER = {"content-length", "x-request-id", "date", "server-timing", "set-cookie"}
_JSON_ACCEPTS = {"", "*/*", "application/json"}


@dataclass(frozen=True)
class _Route:
    view: type[InclusionProofView] | type[ConsistencyProofView]
    params: frozenset[str]


@cache
def _routes() -> dict[str, _Route]:
    return {
        reverse("audit-proof-inclusion"): _Route(InclusionProofView, frozenset({"index", "size"})),
        reverse("audit-proof-consistency"): _Route(ConsistencyProofView, frozenset({"first", "second"})),
    }


@dataclass(frozen=True)
class _Answered:
    """What the request's log line reads from the view that answered (observability)."""

    tenant: Tenant
    actor: str


class LeanProofMiddleware:
    _renderer: ClassVar[JSONRenderer] = JSONRenderer()
    # Per process and route: the headers and URL match of the full stack's last successful answer.
    seen: ClassVar[dict[str, tuple[list[tuple[str, str]], ResolverMatch]]] = {}

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        route = _routes().get(request.path_info) if request.method == "GET" else None
        raw_key = _plain_call(request, route) if route is not None else None
        if route is None or raw_key is None:
            return self.get_response(request)
        seen = self.seen.get(request.path_info)
        if seen is not None:
            answered = _answer(request.GET, route, raw_key)
            if answered is not None:
                return self._respond(request, seen, *answered)
        response = self.get_response(request)
        if response.status_code == 200 and not response.streaming:
            headers = [(k, v) for k, v in response.items() if k.lower() not in _PER_ANSWER]
            if request.resolver_match is not None:
                self.seen[request.path_info] = (headers, request.resolver_match)
        return response

    def _respond(
        self,
        request: HttpRequest,
        seen: tuple[list[tuple[str, str]], ResolverMatch],
        data: dict[str, Any],
        api_key: ApiKey,
        tenant: Tenant,
    ) -> HttpResponse:
        headers, match = seen
        body = self._renderer.render(data)
        response = HttpResponse(body)
        for name, value in headers:
            response[name] = value
        response["Content-Length"] = str(len(body))
        request.resolver_match = match
        response.renderer_context = {"view": _Answered(tenant, api_key_actor(api_key.prefix))}  # type: ignore[attr-defined]
        return response


def _plain_call(request: HttpRequest, route: _Route) -> str | None:
    """The presented API key when the call is one the lean path may answer; else None."""
    meta = request.META
    if meta.get("HTTP_COOKIE") or meta.get("CONTENT_LENGTH") not in (None, "", "0"):
        return None
    try:
        request.get_host()  # a host not allowed: CommonMiddleware's 400, further in
    except DisallowedHost:
        return None
    if meta.get("HTTP_ACCEPT", "").strip() not in _JSON_ACCEPTS or not set(request.GET) <= route.params:
        return None
    scheme, _, raw_key = meta.get("HTTP_AUTHORIZATION", "").partition(" ")
    return (raw_key.strip() or None) if scheme == "Bearer" else None


def _answer(
    query: Mapping[str, str], route: _Route, raw_key: str
) -> tuple[dict[str, Any], ApiKey, Tenant] | None:
    try:
        api_key, tenant, _version = verify_api_key(raw_key)
    except AuthenticationFailed:
        return None  # the full stack refuses it, in its words
    rule = policy.rule_for(route.view.access, "GET")
    if rule is None or policy.decide(rule, api_key=api_key) is not None:
        return None
    scope = tenant_statements if route.view.statement_scoped else tenant_context
    try:
        with scope(tenant):
            return route.view.answer(query), api_key, tenant
    except Exception:  # a refusal or an error: the full stack answers it, in its words
        return None
