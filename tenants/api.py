"""The one mixin every tenant API view inherits, and the tenant's own endpoints (who am I, keys).

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
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import scoping, services
from tenants.authentication import ApiKeyPrincipal
from tenants.models import ApiKey, Membership, Role, Scope, Tenant

TENANT_HEADER = "HTTP_X_SAGAPLANE_TENANT"
SESSION_TENANT_KEY = "tenant_slug"


def memberships_of(user: Any) -> list[Membership]:
    """Every tenant a person belongs to: by nature a cross-tenant question (the tenant switcher)."""
    with scoping.dangerously_bypass_tenant_scope():
        return list(Membership.objects.select_related("tenant").filter(user=user).order_by("tenant__slug"))


def membership_for(user: Any, tenant_slug: str | None) -> Membership | None:
    """The membership a signed-in person acts through: the tenant named by the header or the
    session, or their only tenant. None when they are not a member (callers answer 404)."""
    memberships = memberships_of(user)
    if tenant_slug:
        return next((m for m in memberships if m.tenant.slug == tenant_slug), None)
    return memberships[0] if len(memberships) == 1 else None


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


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["slug", "name", "created_at"]


class CurrentTenantView(TenantScopedViewMixin, APIView):
    """The tenant these credentials act for."""

    required_scopes = {"GET": "read"}

    @extend_schema(
        responses=inline_serializer(
            "CurrentTenant",
            {
                "tenant": TenantSerializer(),
                "role": serializers.CharField(allow_null=True),
                "scopes": serializers.ListField(child=serializers.CharField(), allow_null=True),
            },
        )
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "tenant": TenantSerializer(self.tenant).data,
                "role": self.membership.role if self.membership else None,
                "scopes": self.api_key.scopes if self.api_key else None,
            }
        )


class ApiKeySerializer(serializers.ModelSerializer):
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), allow_empty=False)

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_at", "expires_at", "revoked_at", "last_used_at"]
        read_only_fields = ["id", "prefix", "created_at", "revoked_at", "last_used_at"]


class ApiKeyListView(TenantScopedViewMixin, generics.ListCreateAPIView):
    """List the tenant's API keys, or create one (the key is in the response, once)."""

    serializer_class = ApiKeySerializer
    required_capability = {"GET": "manage_keys", "POST": "manage_keys"}

    def get_queryset(self) -> Any:
        return ApiKey.objects.order_by("-created_at")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        api_key, raw_key = services.create_api_key(
            self.tenant,
            name=serializer.validated_data["name"],
            scopes=serializer.validated_data["scopes"],
            expires_at=serializer.validated_data.get("expires_at"),
            created_by=request.user,
            actor=self.actor,
        )
        return Response({**ApiKeySerializer(api_key).data, "key": raw_key}, status=status.HTTP_201_CREATED)


class ApiKeyDetailView(TenantScopedViewMixin, generics.RetrieveDestroyAPIView):
    """One API key; DELETE revokes it (the row stays, for the audit trail)."""

    serializer_class = ApiKeySerializer
    required_capability = {"GET": "manage_keys", "DELETE": "manage_keys"}

    def get_queryset(self) -> Any:
        return ApiKey.objects.all()

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.revoke_api_key(self.get_object(), actor=self.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MembershipSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["id", "username", "email", "role", "created_at"]


class MembershipListView(TenantScopedViewMixin, generics.ListAPIView):
    """The tenant's members and their roles."""

    serializer_class = MembershipSerializer
    required_scopes = {"GET": "read"}

    def get_queryset(self) -> Any:
        return Membership.objects.select_related("user").order_by("user__username")
