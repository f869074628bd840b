"""API-key authentication for agents: `Authorization: Bearer sp_<prefix>_<secret>`."""

from __future__ import annotations

import copy
import hmac
import time
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants.models import ApiKey, Tenant, hash_api_key
from tenants.scoping import tenant_context
from tenants.selectors import api_key_and_tenant

# Writing last_used_at on every request would turn each read into a write; a minute is precise enough.
LAST_USED_RESOLUTION = timedelta(minutes=1)

# A key that authenticated is taken as checked for this long, in this process (its row read once
# per key per process per window, not per request). The bound on revocation: a key revoked in
# another process keeps working here for at most this long; the process that revokes it forgets
# it at once (`forget`). Expiry is checked on every request from the remembered row.
API_KEY_CACHE_SECONDS = 2.0
_API_KEY_CACHE_MAX = 4096
_checked: dict[str, tuple[float, str, ApiKey, Tenant]] = {}


def _recently_checked(prefix: str, raw_key: str) -> tuple[ApiKey, Tenant] | None:
    entry = _checked.get(prefix)
    if entry is None:
        return None
    until, digest, api_key, tenant = entry
    if time.monotonic() >= until or not hmac.compare_digest(digest, hash_api_key(raw_key)):
        return None
    return copy.copy(api_key), tenant  # a request may set attributes on its own key object


def _remember(prefix: str, raw_key: str, api_key: ApiKey, tenant: Tenant) -> None:
    if len(_checked) >= _API_KEY_CACHE_MAX:
        _checked.clear()  # a burst of distinct keys: start over rather than track ages
    until = time.monotonic() + API_KEY_CACHE_SECONDS
    _checked[prefix] = (until, api_key.key_hash, copy.copy(api_key), tenant)


def forget(prefix: str) -> None:
    """Drop a key from this process's memory of checked keys (on revocation)."""
    _checked.pop(prefix, None)


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
        # cross tenants, asked with the presented key's hash so it answers only its holder (one
        # statement on Postgres), and remembered for at most API_KEY_CACHE_SECONDS.
        found = _recently_checked(prefix, raw_key)
        if found is None:
            found = api_key_and_tenant(prefix, raw_key)
            if found is None:
                raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key")
            _remember(prefix, raw_key, *found)
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
