"""Server-rendered pages. They read through services and the tenant mixin's rules, never around them.

Every page view is wrapped in `member_page(capability)`: it requires a signed-in person, resolves
the tenant they act for (the session's choice, else their only or first tenant), refuses with a
403 page when their role lacks the capability, and runs the view with that tenant active (ORM
scoping and Postgres row-level security). Objects of another tenant are simply not found: 404.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from tenants.models import ROLE_CAPABILITIES, Membership
from tenants.permissions import SESSION_TENANT_KEY
from tenants.scoping import tenant_context
from tenants.selectors import membership_for, memberships_of

# (url name, label, capability): the navigation, filtered by what the member's role allows.
NAV: list[tuple[str, str, str]] = [
    ("sagas", "Sagas", "read"),
    ("fleet", "Fleet", "read"),
    ("evidence", "Evidence", "audit"),
    ("members", "Administration", "manage_members"),
]


def _membership_or_404(request: HttpRequest) -> Membership:
    membership = membership_for(request.user, request.session.get(SESSION_TENANT_KEY))
    if membership is None:
        memberships = memberships_of(request.user)
        if not memberships:
            raise Http404("you are not a member of any tenant")
        membership = memberships[0]
        request.session[SESSION_TENANT_KEY] = membership.tenant.slug
    return membership


def page(
    request: HttpRequest,
    template: str,
    context: dict[str, Any] | None = None,
    *,
    section: str = "",
    status: int = 200,
) -> HttpResponse:
    """Render a full page with the layout's context (membership, tenant switcher, navigation)."""
    membership: Membership | None = getattr(request, "membership", None)
    nav = []
    if membership is not None:
        nav = [
            {"url": reverse(name), "label": label, "current": name == section}
            for name, label, capability in NAV
            if membership.can(capability)
        ]
    full = {
        "membership": membership,
        "tenant": membership.tenant if membership else None,
        "memberships": memberships_of(request.user) if request.user.is_authenticated else [],
        "nav": nav,
        "caps": ROLE_CAPABILITIES[membership.role] if membership else frozenset(),
        "section": section,
        **(context or {}),
    }
    return render(request, template, full, status=status)


def forbidden(request: HttpRequest, capability: str, section: str = "") -> HttpResponse:
    return page(request, "frontend/403.html", {"capability": capability}, section=section, status=403)


def member_page(capability: str = "read", section: str = "") -> Callable:
    """Decorator for a tenant page or action: signed in, a member, allowed, tenant active."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            membership = _membership_or_404(request)
            request.membership = membership  # type: ignore[attr-defined]
            request.tenant = membership.tenant  # type: ignore[attr-defined]
            if not membership.can(capability):
                return forbidden(request, capability, section)
            with tenant_context(membership.tenant):
                return view(request, *args, **kwargs)

        return wrapper

    return decorate


def actor_of(request: HttpRequest) -> str:
    """Who is acting, as written into audit records (same form as the API mixin's)."""
    return f"user:{request.user.get_username()}"


@login_required
def home(request: HttpRequest) -> HttpResponse:
    _membership_or_404(request)
    return redirect("sagas")


@login_required
@require_POST
def switch_tenant(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("tenant", "")
    if membership_for(request.user, slug) is None:
        raise Http404("no such tenant for this user")
    request.session[SESSION_TENANT_KEY] = slug
    return redirect("home")
