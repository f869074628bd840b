"""API-key authentication for agents: `Authorization: Bearer sp_<prefix>_<secret>`."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants.models import ApiKey, Tenant
from tenants.scoping import tenant_context
from tenants.selectors import api_key_and_tenant

# Writing last_used_at on every request would turn each read into a write; a minute is precise enough.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyPrincipal:
    """The request's user when an agent authenticates with a key: it acts for one tenant only."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False

    def __init__(self, api_key: ApiKey, tenant: Tenant) -> None:
        self.api_key = api_key
        self.tenant = tenant
        self.pk = None
        self.username = f"api-key:{api_key.prefix}"

    def __str__(self) -> str:
        return self.username


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKeyPrincipal, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        if scheme != self.keyword:
            return None
        raw_key = raw_key.strip()
        prefix = ApiKey.prefix_of(raw_key)
        if prefix is None:
            raise exceptions.AuthenticationFailed("malformed API key", code="invalid_api_key")
        # Which tenant the key belongs to is what we are finding out: the one question that must
        # cross tenants, asked with the presented key's hash so it answers only its holder. Read
        # on every request (one statement on Postgres): a revoked key is refused immediately.
        found = api_key_and_tenant(prefix, raw_key)
        if found is None:
            raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key")
        api_key, tenant = found
        if not api_key.matches(raw_key):
            raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key")
        if api_key.is_revoked:
            raise exceptions.AuthenticationFailed("this API key was revoked", code="revoked_api_key")
        if api_key.is_expired:
            raise exceptions.AuthenticationFailed("this API key has expired", code="expired_api_key")
        now = timezone.now()
        if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
            with tenant_context(tenant):
                ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
            api_key.last_used_at = now
        api_key.tenant = tenant
        return ApiKeyPrincipal(api_key, tenant), api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
