"""API-key authentication for agents: `Authorization: Bearer sp_<prefix>_<secret>`.

Two per-process memories of checked keys, both re-checking the presented secret's hash and the
key's expiry on every request:
- `ApiKeyAuthentication` (every DRF view) remembers a key for API_KEY_CACHE_SECONDS: a revocation
  in another process is honoured within that bound;
- `verify_api_key` (the gate's lean path, controlplane/gate_asgi.py) remembers a key while its
  tenant's epoch (`tenants.epoch`, one cache GET that the gate's decision reuses) reads as it did
  before the row was read: revoking a key moves the epoch when the revocation commits, so the next
  request in any process re-reads the row and is refused. Should the bump be lost (the cache
  unreachable just then), no copy outlives `epoch.MAX_AGE_S`.
"""

from __future__ import annotations

import copy
import hmac
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants import epoch
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
# Moved by every `forget`: a row read before a revocation in this process is not remembered after
# it (the revocation forgot the key while the read was in flight).
_forgets = 0


def _recently_checked(prefix: str, raw_key: str) -> tuple[ApiKey, Tenant] | None:
    entry = _checked.get(prefix)
    if entry is None:
        return None
    until, digest, api_key, tenant = entry
    if time.monotonic() >= until or not hmac.compare_digest(digest, hash_api_key(raw_key)):
        return None
    return copy.copy(api_key), tenant  # a request may set attributes on its own key object


def _remember(prefix: str, api_key: ApiKey, tenant: Tenant, *, forgets_before_read: int) -> None:
    if _forgets != forgets_before_read:
        return  # a key was forgotten (revoked) while this row was read: it may be that one
    if len(_checked) >= _API_KEY_CACHE_MAX:
        _checked.clear()  # a burst of distinct keys: start over rather than track ages
    until = time.monotonic() + API_KEY_CACHE_SECONDS
    _checked[prefix] = (until, api_key.key_hash, copy.copy(api_key), tenant)


def forget(prefix: str) -> None:
    """Drop a key from this process's memories of checked keys (on revocation)."""
    global _forgets
    _forgets += 1
    _checked.pop(prefix, None)
    with _held_lock:
        _held.pop(prefix, None)


@dataclass(frozen=True)
class _Held:
    api_key: ApiKey
    tenant: Tenant
    version: Any  # the tenant's epoch, read before the row
    read_at: float


_HELD_MAX = 4096
_held: OrderedDict[str, _Held] = OrderedDict()
_held_lock = threading.Lock()


def _held_copy(prefix: str, raw_key: str) -> tuple[_Held | None, Any]:
    """(this process' copy of the key, if still current, and the tenant's epoch as just read)."""
    with _held_lock:
        held = _held.get(prefix)
    if held is None:
        return None, None
    version = epoch.read(held.tenant.pk)
    current = (
        version is not None
        and version == held.version
        and time.monotonic() - held.read_at < epoch.MAX_AGE_S
        and hmac.compare_digest(held.api_key.key_hash, hash_api_key(raw_key))
    )
    return (held if current else None), version


def _read_key(prefix: str, raw_key: str, version: Any, tenant_id: int | None) -> tuple[ApiKey, Tenant, Any]:
    """The key's row, read after the tenant's epoch (`version`, read for `tenant_id`; read here
    when the tenant was not yet known), and kept under it."""
    found = api_key_and_tenant(prefix, raw_key)
    if found is not None and found[1].pk != tenant_id:
        # Its tenant just learnt: read the epoch, then the row again, so a revocation committing
        # between the first read and the epoch is not kept under the newer epoch.
        version = epoch.read(found[1].pk)
        found = api_key_and_tenant(prefix, raw_key)
    if found is None:
        raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key")
    api_key, tenant = found
    if version is not None:
        with _held_lock:
            _held[prefix] = _Held(copy.copy(api_key), tenant, version, time.monotonic())
            _held.move_to_end(prefix)
            while len(_held) > _HELD_MAX:
                _held.popitem(last=False)
    return api_key, tenant, version


def verify_api_key(raw_key: str) -> tuple[ApiKey, Tenant, Any]:
    """The key `raw_key` names, its tenant, and the tenant's epoch as read for this check (the
    gate reuses it for its decision); AuthenticationFailed when the key is malformed, unknown,
    wrong, revoked or expired. Revocation is honoured on the next request in every process."""
    prefix = ApiKey.prefix_of(raw_key)
    if prefix is None:
        raise exceptions.AuthenticationFailed("malformed API key", code="invalid_api_key")
    held, version = _held_copy(prefix, raw_key)
    if held is not None:
        api_key, tenant = copy.copy(held.api_key), held.tenant
    else:
        with _held_lock:
            known = _held.get(prefix)
        api_key, tenant, version = _read_key(prefix, raw_key, version, known.tenant.pk if known else None)
    _check_usable(api_key, raw_key)
    _note_use(api_key, tenant)
    api_key.tenant = tenant
    return api_key, tenant, version


def _check_usable(api_key: ApiKey, raw_key: str) -> None:
    if not api_key.matches(raw_key):
        raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key")
    if api_key.is_revoked:
        raise exceptions.AuthenticationFailed("this API key was revoked", code="revoked_api_key")
    if api_key.is_expired:
        raise exceptions.AuthenticationFailed("this API key has expired", code="expired_api_key")


def _note_use(api_key: ApiKey, tenant: Tenant) -> None:
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        with tenant_context(tenant):
            ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
        _remember_use(api_key.prefix, now)


def _remember_use(prefix: str, when: datetime) -> None:
    """Note the write on this process's remembered rows too. Requests are served from copies of
    them: had only the copy noted it, every request until the row was next read (the cache window)
    wrote last_used_at again -- an UPDATE per request for the first seconds of each key, then again
    for a window each minute (seen: 860 of 1,000 proof requests with a fresh key)."""
    entry = _checked.get(prefix)
    if entry is not None:
        entry[2].last_used_at = when
    with _held_lock:
        held = _held.get(prefix)
    if held is not None:
        held.api_key.last_used_at = when


def remembered_key(raw_key: str) -> tuple[ApiKey, Tenant] | None:
    """The key and its tenant, when this process checked the key within API_KEY_CACHE_SECONDS and
    it is still usable now (the checks `ApiKeyAuthentication` makes, its last use noted as it
    notes it); None whenever only the full authentication can answer (not remembered, malformed,
    revoked, expired). For a lean path that hands every None to the full stack."""
    prefix = ApiKey.prefix_of(raw_key)
    found = _recently_checked(prefix, raw_key) if prefix is not None else None
    if found is None:
        return None
    api_key, tenant = found
    try:
        _check_usable(api_key, raw_key)
    except exceptions.AuthenticationFailed:
        return None
    _note_use(api_key, tenant)
    api_key.tenant = tenant
    return api_key, tenant


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
            forgets = _forgets
            found = api_key_and_tenant(prefix, raw_key)
            if found is None:
                raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key")
            _remember(prefix, *found, forgets_before_read=forgets)
        api_key, tenant = found
        _check_usable(api_key, raw_key)
        _note_use(api_key, tenant)
        api_key.tenant = tenant
        return ApiKeyPrincipal(api_key, tenant), api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
