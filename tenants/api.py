"""The tenant's own endpoints: who am I, API keys, members."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import services
from tenants.access import MANAGE_KEYS, MANAGE_MEMBERS, READ
from tenants.models import ApiKey, Membership, Role, Scope, Tenant
from tenants.permissions import TenantScopedViewMixin


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["slug", "name", "created_at"]


class CurrentTenantView(TenantScopedViewMixin, APIView):
    """The tenant these credentials act for."""

    access = {"GET": READ}

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
    access = {"GET": MANAGE_KEYS, "POST": MANAGE_KEYS}

    def get_queryset(self) -> Any:
        return ApiKey.objects.order_by("-created_at")

    @extend_schema(request=services.ApiKeyCreate, responses={201: ApiKeySerializer})
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.create(request, *args, **kwargs)

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        new = services.ApiKeyCreate.parse(request.data)
        api_key, raw_key = services.create_api_key(
            self.tenant, new, created_by=request.user, actor=self.actor
        )
        return Response({**ApiKeySerializer(api_key).data, "key": raw_key}, status=status.HTTP_201_CREATED)


class ApiKeyDetailView(TenantScopedViewMixin, generics.RetrieveDestroyAPIView):
    """One API key; DELETE revokes it (the row stays, for the audit trail)."""

    serializer_class = ApiKeySerializer
    access = {"GET": MANAGE_KEYS, "DELETE": MANAGE_KEYS}

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
    """The tenant's members and their roles (every member's e-mail: the administration page's
    rule, closed to API keys)."""

    serializer_class = MembershipSerializer
    access = {"GET": MANAGE_MEMBERS}

    def get_queryset(self) -> Any:
        return Membership.objects.select_related("user").order_by("user__username")
