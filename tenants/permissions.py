"""The one mixin every tenant API view inherits: authenticate, decide, then run in the tenant.

A view declares `access`, one `tenants.access.Access` per HTTP method it answers (usually a named
rule: `{"GET": access.READ}`); `tenants.access.decide` is what checks it. A method without a rule
answers 405, and a view that defines a handler without declaring its rule fails at import.

Order of a request, each step before the next: the method must be declared (405); the body is
read, bounded (413), before anything touches the database, so a slow upload holds no transaction
or pooled connection; the caller is authenticated (401) and checked against the rule (403), a
member's tenant resolved (404); then the handler runs in one transaction with the tenant active
for the ORM and Postgres row-level security. A refusal the handler raises is answered inside that
transaction (so a refused batch's evidence is kept); an exception nobody answers rolls it back.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, UnreadablePostError
from django.http.request import RawPostDataException
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response

from core import availability, timing
from core.actors import Actor
from core.errors import DomainError
from core.numbers import ascii_int
from core.scoping import tenant_context, tenant_statements
from tenants import access as policy
from tenants.actors import api_key_actor, user_actor
from tenants.authentication import ApiKeyPrincipal
from tenants.models import ApiKey, Membership, Tenant
from tenants.selectors import membership_for

TENANT_HEADER = "HTTP_X_SAGAPLANE_TENANT"
SESSION_TENANT_KEY = "tenant_slug"

_HANDLERS = ("get", "post", "put", "patch", "delete")


def read_body_first(request: HttpRequest) -> None:
    """Read the whole body now, at most `SAGAPLANE_MAX_BODY_BYTES` (a larger declared length is
    refused before a byte is read), so no transaction is open while a client uploads. Later
    readers (`request.read()`, DRF's parsers) get the same bytes from memory."""
    limit = settings.SAGAPLANE_MAX_BODY_BYTES
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared:
        size = ascii_int(declared)
        if size is None:
            raise DomainError("invalid", "Content-Length is not a number", field="Content-Length")
        if size > limit:
            raise DomainError(
                "too_large",
                f"body of {declared} bytes exceeds the limit of {limit} bytes",
                status=413,
                context={"limit": limit},
            )
    try:
        request.body  # noqa: B018 -- reading caches it; Django bounds it by DATA_UPLOAD_MAX_MEMORY_SIZE
    except RawPostDataException:
        pass  # a form parser consumed it already: nothing left to wait for
    except RequestDataTooBig:
        raise DomainError(
            "too_large", f"body exceeds the limit of {limit} bytes", status=413, context={"limit": limit}
        ) from None
    except UnreadablePostError:
        raise DomainError("unreadable_body", "the request body could not be read in full") from None


if TYPE_CHECKING:
    from rest_framework.views import APIView

    _ViewBase = APIView  # the mixin is always used with an APIView: its methods are typed
else:
    _ViewBase = object


class TenantScopedViewMixin(_ViewBase):
    """Declare `access`; the mixin authenticates, decides, reads the body, then runs the handler
    in one transaction with the tenant active (see the module docstring for the order)."""

    access: ClassVar[policy.AccessMap] = {}
    # Read-only handlers whose statements need no common snapshot (the log's proofs) may opt out
    # of the transaction: on Postgres each statement then carries the tenant's RLS setting
    # itself (scoping.tenant_statements), two round-trips (BEGIN, COMMIT) fewer per request.
    statement_scoped: ClassVar[bool] = False

    tenant: Tenant
    membership: Membership | None
    api_key: ApiKey | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        undeclared = [
            m.upper() for m in _HANDLERS if callable(getattr(cls, m, None)) and m.upper() not in cls.access
        ]
        if undeclared:
            raise ImproperlyConfigured(
                f"{cls.__module__}.{cls.__qualname__} answers {', '.join(undeclared)} with no access rule: "
                "declare one in its `access` (tenants.access)"
            )

    @property
    def allowed_methods(self) -> list[str]:
        return policy.allowed_methods(self.access)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        # DRF's APIView.dispatch, with the transaction around the handler alone: nothing that
        # waits on the client (the body) or refuses it (authentication, the rule) holds one.
        self.args = args
        self.kwargs = kwargs
        drf_request = self.initialize_request(request, *args, **kwargs)
        self.request = drf_request
        self.headers = self.default_response_headers
        try:
            if policy.rule_for(self.access, request.method or "") is None:
                raise exceptions.MethodNotAllowed(request.method or "")
            read_body_first(request)
            self.initial(drf_request, *args, **kwargs)
        except Exception as exc:
            response = self.handle_exception(exc)
        else:
            response = self._handled_in_scope(drf_request, *args, **kwargs)
        self.response: Response = self.finalize_response(drf_request, response, *args, **kwargs)
        return self.response

    def _handled_in_scope(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The handler's answer, inside the tenant's scope. A scope that cannot be entered or
        committed (the database unreachable, its pool's wait over) is answered as the handler's own
        exceptions are (the gate's: a 503 refusal with Retry-After), never left to become a 500."""
        handler = getattr(self, (request.method or "").lower())
        scope = tenant_statements if self.statement_scoped else tenant_context
        try:
            with timing.collecting() as phases:
                with scope(self.tenant):
                    try:
                        response: Response = handler(request, *args, **kwargs)
                    except Exception as exc:
                        # Answered inside the transaction, so what a refusing service chose to
                        # keep (a refused batch is evidence) commits; an exception nobody answers
                        # is re-raised here and rolls everything back.
                        response = self.handle_exception(exc)
                    handled = time.perf_counter()
                if phases:  # a handler that marks its phases (ingest) also learns its commit's
                    phases["commit"] = time.perf_counter() - handled
                    response["Server-Timing"] = timing.header(phases)
        except DatabaseError as exc:
            return self.handle_exception(exc)
        return response

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        availability.guard_database()  # known down: refused before anything waits on it
        super().initial(request, *args, **kwargs)  # authenticates: 401
        rule = policy.rule_for(self.access, request.method or "")
        assert rule is not None  # dispatch answered 405 already
        principal = request.user
        self.api_key = None
        self.membership = None
        if isinstance(principal, ApiKeyPrincipal):
            refusal = policy.decide(rule, api_key=principal.api_key)
            if refusal is not None:
                raise exceptions.PermissionDenied(refusal.detail, code=refusal.code)
            self.api_key = principal.api_key
            self.tenant = principal.tenant
            return
        slug = request.META.get(TENANT_HEADER) or request.session.get(SESSION_TENANT_KEY)
        membership = membership_for(principal, slug)
        if membership is None:
            raise exceptions.NotFound("no such tenant for this user", code="tenant_not_found")
        refusal = policy.decide(rule, membership=membership)
        if refusal is not None:
            raise exceptions.PermissionDenied(refusal.detail, code=refusal.code)
        self.membership = membership
        self.tenant = membership.tenant

    @property
    def actor(self) -> Actor:
        """Who is acting (audit records store `str(actor)`)."""
        if self.api_key is not None:
            return api_key_actor(self.api_key.prefix)
        return user_actor(self.request.user.get_username())
