"""Fast routes: a few hot routes answered without Django's request stack, one mechanism for all.

Two transports use it: the gate's `POST /api/v1/gate/evaluate` in front of Django's ASGI handler
(controlplane/gate_asgi.py) and the proofs' GETs as a middleware inside it (transparency/lean.py).
Each answers only a call the full stack would answer the same way, and hands every other call on,
untouched, to the full stack, which answers (and words every refusal) as before. What they must
decide alike is decided here, once:

- whether a call is plain enough (`plain_key`): the process' database role verified
  (core.rls), Django's own reading of the host (`HttpRequest.get_host`, ALLOWED_HOSTS) and of
  https where it is required (`is_secure`, SECURE_SSL_REDIRECT), no query parameter the route does
  not read, and a bearer key read as the DRF authentication class reads it
  (`tenants.authentication.bearer_key`);
- who calls and whether they may (`admitted`): the key verified by `verify_api_key`, the DRF
  authentication class's own check, then the rule the route table declares for the route and
  method (the view's `access`, `tenants.access.decide`): access is declared once, on the view;
- the answer's headers (`HEADERS`): those of the full stack's last successful answer on the same
  route for the same request class (https or not: HSTS is sent over https only), less those that
  belong to one answer (`PER_ANSWER`). Until the full stack has answered a route and class once,
  its calls go through the full stack, so the security headers are always the middleware's own.

A fast route's own work (reading the body, the answer itself, the log line) stays with its
transport: the route table knows nothing of it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.urls import ResolverMatch, resolve, reverse
from rest_framework.exceptions import AuthenticationFailed

from tenants import access
from tenants.authentication import bearer_key, verify_api_key

if TYPE_CHECKING:
    from core.epoch import Epoch
    from tenants.models import ApiKey, Tenant

PER_ANSWER = frozenset({"content-length", "date", "server", "server-timing", "set-cookie", "x-request-id"})
"""Headers of the full stack's answer that belong to that answer only: never reused."""


@dataclass(frozen=True)
class FastRoute:
    """One route and method a transport answers fast; everything else about it is the route
    table's (its path, its view and the view's declared access)."""

    url_name: str
    method: str
    params: frozenset[str] = frozenset()
    """The query parameters the answer reads; a call with any other is the full stack's."""

    @cached_property
    def path(self) -> str:
        return reverse(self.url_name)

    @cached_property
    def match(self) -> ResolverMatch:
        """The URL match the full stack makes for the route (the request's log line names it)."""
        return resolve(self.path)

    @cached_property
    def view(self) -> Any:
        """The route's view class (DRF's), as the URL conf names it."""
        return getattr(self.match.func, "view_class")  # noqa: B009  (set by as_view, untyped)

    @cached_property
    def rule(self) -> access.Access | None:
        """The access rule the route's view declares for the method (None: not answered)."""
        return access.rule_for(self.view.access, self.method)


def plain_key(request: HttpRequest, route: FastRoute) -> str | None:
    """The bearer key of a call `route` may answer as the full stack would; None when the call is
    the full stack's (its checks and refusals are Django's own)."""
    from core.rls import RuntimeRoleGuardMiddleware

    if not RuntimeRoleGuardMiddleware.verified or request.method != route.method:
        return None
    if not set(request.GET) <= route.params:
        return None
    if settings.SECURE_SSL_REDIRECT and not request.is_secure():
        return None  # SecurityMiddleware's redirect
    try:
        request.get_host()
    except DisallowedHost:
        return None  # CommonMiddleware's 400
    return bearer_key(request.META.get("HTTP_AUTHORIZATION", "")) or None


def admitted(raw_key: str, route: FastRoute) -> tuple[ApiKey, Tenant, Epoch | None] | None:
    """The key, its tenant and the tenant's epoch as read for the check, when the key verifies
    and the route's declared rule admits it; None when either refuses (the full stack says why)."""
    try:
        api_key, tenant, version = verify_api_key(raw_key)
    except AuthenticationFailed:
        return None
    rule = route.rule
    if rule is None or access.decide(rule, api_key=api_key) is not None:
        return None
    return api_key, tenant, version


@dataclass(frozen=True)
class Learned:
    """A route's headers for one request class, as set on an HttpResponse and as ASGI sends them."""

    items: tuple[tuple[str, str], ...]
    raw: tuple[tuple[bytes, bytes], ...]


class RouteHeaders:
    """Per process: each fast route's headers per request class, learned from the full stack."""

    def __init__(self) -> None:
        self._learned: dict[tuple[str, bool], Learned] = {}
        self._lock = threading.Lock()

    def get(self, route: FastRoute, secure: bool) -> Learned | None:
        return self._learned.get((route.url_name, secure))

    def learn(self, route: FastRoute, secure: bool, headers: Iterable[tuple[str, str]]) -> None:
        """Note the headers of the full stack's successful answer to a call of this class."""
        kept = tuple((name, value) for name, value in headers if name.lower() not in PER_ANSWER)
        raw = tuple((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in kept)
        with self._lock:
            self._learned[(route.url_name, secure)] = Learned(kept, raw)

    def forget(self) -> None:
        """As in a new process (tests)."""
        with self._lock:
            self._learned.clear()


HEADERS = RouteHeaders()
