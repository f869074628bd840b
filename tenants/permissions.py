"""Who may call what: the one mixin every tenant API view inherits.

A view states what it needs, never how to check it:
- `required_scopes`: per HTTP method, the API-key scope an agent needs (e.g. {"POST": "ingest"});
  a method missing from the map is closed to API keys;
- `required_capability`: per HTTP method, what a signed-in member's role must allow
  (see `tenants.models.ROLE_CAPABILITIES`); default "read".
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import transaction
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.request import Request

from tenants import scoping
from tenants.authentication import ApiKeyPrincipal
from tenants.models import ApiKey, Membership, Tenant
from tenants.selectors import membership_for

TENANT_HEADER = "HTTP_X_SAGAPLANE_TENANT"
SESSION_TENANT_KEY = "tenant_slug"


class TenantScopedViewMixin:
    """Authenticates, resolves the tenant, checks scope or role, then runs the whole view in one
    transaction with the tenant active for the ORM and for Postgres row-level security."""

    required_scopes: ClassVar[dict[str, str]] = {}
    required_capability: ClassVar[dict[str, str]] = {}

    tenant: Tenant
    membership: Membership | None
    api_key: ApiKey | None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        self._tenant_token = None
        with transaction.atomic():
            try:
                return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
            finally:
                if self._tenant_token is not None:
                    scoping.deactivate(self._tenant_token)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        method = request.method.upper() if request.method != "HEAD" else "GET"
        principal = request.user
        self.api_key = None
        self.membership = None
        if isinstance(principal, ApiKeyPrincipal):
            scope = self.required_scopes.get(method)
            if scope is None or not principal.api_key.has_scope(scope):
                needed = scope or "(not available to API keys)"
                raise exceptions.PermissionDenied(
                    f"this API key lacks the '{needed}' scope", code="missing_scope"
                )
            self.api_key = principal.api_key
            self.tenant = principal.tenant
        else:
            slug = request.META.get(TENANT_HEADER) or request.session.get(SESSION_TENANT_KEY)
            membership = membership_for(principal, slug)
            if membership is None:
                raise exceptions.NotFound("no such tenant for this user", code="tenant_not_found")
            capability = self.required_capability.get(method, "read")
            if not membership.can(capability):
                raise exceptions.PermissionDenied(
                    f"the role '{membership.role}' may not {capability}", code="role_forbidden"
                )
            self.membership = membership
            self.tenant = membership.tenant
        self._tenant_token = scoping.activate(self.tenant)

    @property
    def actor(self) -> str:
        """Who is acting, as written into audit records."""
        if self.api_key is not None:
            return f"api-key:{self.api_key.prefix}"
        return f"user:{self.request.user.get_username()}"  # type: ignore[attr-defined]
