"""Read-only questions about tenants, members and keys that other apps (and views) may ask."""

from __future__ import annotations

import json
import re
from typing import Any

from core import rls, scoping
from tenants.models import ApiKey, Membership, Tenant, hash_api_key

# The two questions about tenants that must cross them (core/rls.py): SECURITY DEFINER
# functions on Postgres, each answering only its question.
_API_KEY_TENANT = rls.cross_tenant_function(
    "sagaplane_api_key_tenant",
    arguments="wanted_prefix text",
    returns="TABLE (tenant_id bigint)",
    body=f"SELECT tenant_id FROM {ApiKey._meta.db_table} WHERE prefix = wanted_prefix",
)
# Authentication's one statement on Postgres: the key and its tenant, for a presented key's prefix
# AND hash (so the function never hands out a hash, or anything at all, for a prefix alone).
_API_KEY_COLUMNS = tuple(f.attname for f in ApiKey._meta.concrete_fields)  # column == attname
_TENANT_COLUMNS = tuple(f.attname for f in Tenant._meta.concrete_fields)
_API_KEY_AUTH = rls.cross_tenant_function(
    "sagaplane_api_key_auth",
    arguments="wanted_prefix text, presented_hash text",
    returns="TABLE (id bigint, tenant_id bigint, name varchar, prefix varchar, key_hash varchar, "
    "scopes text, created_at timestamptz, created_by_id bigint, expires_at timestamptz, "
    "revoked_at timestamptz, last_used_at timestamptz, "
    "t_id bigint, t_slug varchar, t_name varchar, t_created_at timestamptz)",
    body=f"SELECT {', '.join('k.' + c + ('::text' if c == 'scopes' else '') for c in _API_KEY_COLUMNS)}, "
    f"{', '.join('t.' + c for c in _TENANT_COLUMNS)} "
    f"FROM {ApiKey._meta.db_table} k JOIN {Tenant._meta.db_table} t ON t.id = k.tenant_id "
    "WHERE k.prefix = wanted_prefix AND k.key_hash = presented_hash",
)
_MEMBERSHIP_COLUMNS = ("id", "tenant_id", "role", "created_at")
_MEMBERSHIPS_OF = rls.cross_tenant_function(
    "sagaplane_memberships_of",
    arguments="member_id bigint",
    returns="TABLE (id bigint, tenant_id bigint, role varchar, created_at timestamptz)",
    body=f"SELECT {', '.join(_MEMBERSHIP_COLUMNS)} FROM {Membership._meta.db_table} "
    "WHERE user_id = member_id",
)
_KEY_PREFIX = re.compile(r"[a-z0-9]{12}")


def tenant_of_api_key(prefix: str) -> Tenant | None:
    """The tenant of the API key with this public prefix (None: no such key): what key
    authentication must learn before it can enter a tenant and check the key there."""
    if not _KEY_PREFIX.fullmatch(prefix):
        return None  # not a prefix any key has (ApiKey.generate)
    if rls.enforces_rls():
        tenant_ids = [tenant_id for (tenant_id,) in _API_KEY_TENANT.rows(prefix)]
    else:
        with scoping.dangerously_bypass_orm_scope():
            tenant_ids = list(ApiKey.objects.filter(prefix=prefix).values_list("tenant_id", flat=True))
    return Tenant.objects.filter(pk=tenant_ids[0]).first() if tenant_ids else None


def api_key_and_tenant(prefix: str, raw_key: str) -> tuple[ApiKey, Tenant] | None:
    """The API key `raw_key` (whose prefix is `prefix`) and its tenant, read fresh (a revoked key
    is refused on the next request), or None when no key has that prefix and secret. Postgres:
    one statement (a cross-tenant function matching prefix and hash together); SQLite: the
    tenant's question, then the key read inside the tenant."""
    if not _KEY_PREFIX.fullmatch(prefix):
        return None
    presented = hash_api_key(raw_key)
    if rls.enforces_rls():
        rows = _API_KEY_AUTH.rows(prefix, presented)
        if not rows:
            return None
        row = rows[0]
        n = len(_API_KEY_COLUMNS)
        values = dict(zip(_API_KEY_COLUMNS, row[:n], strict=True))
        values["scopes"] = json.loads(values["scopes"])
        tenant = Tenant.from_db("default", list(_TENANT_COLUMNS), list(row[n:]))
        fields = ApiKey._meta.concrete_fields
        api_key = ApiKey.from_db("default", [f.attname for f in fields], [values[f.attname] for f in fields])
        api_key.tenant = tenant
        return api_key, tenant
    of_key = tenant_of_api_key(prefix)
    if of_key is None:
        return None
    tenant = of_key
    with scoping.tenant_context(tenant):
        found = ApiKey.objects.filter(prefix=prefix).first()
    if found is None:
        return None
    found.tenant = tenant
    return found, tenant


def memberships_of(user: Any) -> list[Membership]:
    """Every tenant a person belongs to: by nature a cross-tenant question (the tenant switcher)."""
    if getattr(user, "pk", None) is None:
        return []  # anonymous, or an API key (which acts for its own tenant, not as a member)
    if not rls.enforces_rls():
        with scoping.dangerously_bypass_orm_scope():
            return list(
                Membership.objects.select_related("tenant").filter(user=user).order_by("tenant__slug")
            )
    rows = [dict(zip(_MEMBERSHIP_COLUMNS, row, strict=True)) for row in _MEMBERSHIPS_OF.rows(user.pk)]
    tenants = Tenant.objects.in_bulk([row["tenant_id"] for row in rows])
    memberships = []
    for row in rows:
        row["user_id"] = user.pk
        fields = Membership._meta.concrete_fields
        membership = Membership.from_db(
            "default", [f.attname for f in fields], [row[f.attname] for f in fields]
        )
        membership.tenant = tenants[row["tenant_id"]]
        membership.user = user
        memberships.append(membership)
    return sorted(memberships, key=lambda membership: membership.tenant.slug)


def membership_for(user: Any, tenant_slug: str | None) -> Membership | None:
    """The membership a signed-in person acts through: the tenant named by the header or the
    session, or their only tenant. None when they are not a member (callers answer 404)."""
    memberships = memberships_of(user)
    if tenant_slug:
        return next((m for m in memberships if m.tenant.slug == tenant_slug), None)
    return memberships[0] if len(memberships) == 1 else None


# -- the active tenant's members and keys (administration pages) ----------------------------------


def members() -> list[Membership]:
    """The active tenant's memberships with their people, by e-mail."""
    return list(Membership.objects.select_related("user").order_by("user__email", "user__username"))


def member(membership_id: int) -> Membership | None:
    """The active tenant's membership of that id (another tenant's is simply not found)."""
    return Membership.objects.select_related("user").filter(pk=membership_id).first()


def api_keys() -> list[ApiKey]:
    """The active tenant's API keys: live ones first, newest first."""
    return list(ApiKey.objects.select_related("created_by").order_by("revoked_at", "-created_at"))


def api_key(key_id: int) -> ApiKey | None:
    """The active tenant's API key of that id (another tenant's is simply not found)."""
    return ApiKey.objects.filter(pk=key_id).first()
