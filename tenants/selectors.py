"""Read-only questions about tenants, members and keys that other apps (and views) may ask."""

from __future__ import annotations

from typing import Any

from tenants import scoping
from tenants.models import Membership


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
