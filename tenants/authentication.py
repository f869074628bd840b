"""API-key authentication for agents: `Authorization: Bearer sp_<prefix>_<secret>`.

One reading of the header (`bearer_key`) and one per-process memory of checked keys, used by every
path that authenticates a key (DRF's `ApiKeyAuthentication`, and the fast routes of the gate and the
proofs through tenants/fastroute.py), all through `verify_api_key`: a copy of the key's row is
reused only while the tenant's epoch (`core.epoch`, one cache round trip that the gate's decision
reuses) reads as it did before the row was read, no tenant hold is on, and the copy is younger than
`epoch.MAX_AGE_S`; the presented secret's hash and the key's expiry are checked on every request.

Revocation is immediate in every process: `revoke_api_key` puts the tenant on hold before it
commits, so from then on every request reads the row (and, once the revocation has committed,
is refused); the hold outlasts every copy made before it (core/epoch.py).
"""

from __future__ import annotations

import copy
import hmac
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from core import epoch
from core.scoping import tenant_context
from tenants.actors import api_key_actor
from tenants.models import ApiKey, Tenant, hash_api_key
from tenants.selectors import api_key_and_tenant

# Writing last_used_at on every request would turn each read into a write; a minute is precise enough.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class _Held:
    api_key: ApiKey
    tenant: Tenant
    version: epoch.Epoch  # the tenant's epoch, read before the row (its `at`: the copy's birth)


_HELD_MAX = 4096
_held: OrderedDict[str, _Held] = OrderedDict()
_held_lock = threading.Lock()


def forget(prefix: str) -> None:
    """Drop a key from this process' memory (a test's, or a change made here)."""
    with _held_lock:
        _held.pop(prefix, None)


def _held_copy(prefix: str, raw_key: str) -> tuple[_Held | None, epoch.Epoch | None]:
    """(this process' copy of the key, if still current, and the tenant's epoch as just read)."""
    with _held_lock:
        held = _held.get(prefix)
    if held is None:
        return None, None
    version = epoch.read(held.tenant.pk)
    current = (
        version is not None
        and not version.held
        and version == held.version
        and time.monotonic() - held.version.at < epoch.MAX_AGE_S
        and hmac.compare_digest(held.api_key.key_hash, hash_api_key(raw_key))
    )
    return (held if current else None), version


def _read_key(
    prefix: str, raw_key: str, version: epoch.Epoch | None, tenant_id: int | None
) -> tuple[ApiKey, Tenant, epoch.Epoch | None]:
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
    if version is not None and not version.held:
        with _held_lock:
            _held[prefix] = _Held(copy.copy(api_key), tenant, version)
            _held.move_to_end(prefix)
            while len(_held) > _HELD_MAX:
                _held.popitem(last=False)
    return api_key, tenant, version


def verify_api_key(raw_key: str) -> tuple[ApiKey, Tenant, epoch.Epoch | None]:
    """The key `raw_key` names, its tenant, and the tenant's epoch as read for this check (the
    gate reuses it for its decision); AuthenticationFailed when the key is malformed, unknown,
    wrong, revoked or expired. A revocation that has answered is honoured in every process."""
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
    """Note the write on this process's remembered row too. Requests are served from copies of
    it: had only the copy noted it, every request until the row was next read wrote last_used_at
    again -- an UPDATE per request for the first seconds of each key, then again each minute
    (seen: 860 of 1,000 proof requests with a fresh key)."""
    with _held_lock:
        held = _held.get(prefix)
    if held is not None:
        held.api_key.last_used_at = when


def bearer_key(authorization: str) -> str | None:
    """The key an `Authorization` header presents (`Bearer <key>`, blanks around the key ignored;
    possibly empty, which `verify_api_key` refuses as malformed); None when it presents none."""
    scheme, _, raw_key = authorization.partition(" ")
    return raw_key.strip() if scheme == ApiKeyAuthentication.keyword else None


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
        self.username = str(api_key_actor(api_key.prefix))

    def __str__(self) -> str:
        return self.username


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiKeyPrincipal, ApiKey] | None:
        raw_key = bearer_key(authentication.get_authorization_header(request).decode("latin-1"))
        if raw_key is None:
            return None
        api_key, tenant, _version = verify_api_key(raw_key)
        return ApiKeyPrincipal(api_key, tenant), api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
