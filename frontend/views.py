"""Server-rendered pages. They read through services and the tenant mixin's rules, never around them.

Every page view is wrapped in `member_page({method: rule})`, the same declaration and the same
named rules (`tenants.access`) as the API: an undeclared method answers 405; it requires a
signed-in person, resolves the tenant they act for (the session's choice, else their only or
first tenant), refuses with a 403 page when the rule refuses their role (`tenants.access.decide`),
reads the form before any transaction opens, and runs the view with that tenant active (ORM
scoping and Postgres row-level security). Objects of another tenant are simply not found: 404.
A page that waits on the network (Slack's Web API) declares `transaction=False`, as a task does
(`tenants.entry.tenant_task`): it gets the tenant resolved but not entered, and enters
`tenant_context(request.tenant)` around each unit of work that reads or writes, never around the
wait.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, cast

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import resolve, reverse
from django.views.decorators.http import require_POST, require_safe

from approvals import selectors as approval_selectors
from core.actors import Actor
from core.scoping import joined_tenant_context, tenant_context
from tenants.access import AccessMap, allowed_methods, decide, rule_for
from tenants.actors import user_actor
from tenants.models import ROLE_CAPABILITIES, Membership, Tenant
from tenants.permissions import SESSION_TENANT_KEY
from tenants.selectors import membership_for, memberships_of

# (url name, label): the navigation, each entry shown when its page's own GET rule lets the member in.
NAV: list[tuple[str, str]] = [
    ("sagas", "Sagas"),
    ("fleet", "Fleet"),
    ("approval-queue", "Approvals"),
    ("recovery", "Recovery"),
    ("reconciliation", "Reconciliation"),
    ("evidence", "Evidence"),
    ("members", "Administration"),
    ("slack-settings", "Slack"),
]


class MemberRequest(HttpRequest):
    """The request a `member_page` view receives: signed in, a member, the tenant resolved
    (set by the decorator before the view runs; the type says so, healthchecks-style)."""

    user: User
    membership: Membership
    tenant: Tenant


PageView = Callable[..., HttpResponse]


def may_open(membership: Membership, url_name: str) -> bool:
    """Whether the page named `url_name` (no path parameters) lets this member GET it, by the
    page's declared rule: the navigation cannot promise a page that would answer 403."""
    page_access: AccessMap = getattr(resolve(reverse(url_name)).func, "access", {})
    rule = rule_for(page_access, "GET")
    return rule is not None and decide(rule, membership=membership) is None


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
            {"url": reverse(name), "label": label, "current": name == section, "name": name}
            for name, label in NAV
            if may_open(membership, name)
        ]
        for item in nav:
            if item["name"] == "approval-queue":  # the count waiting for someone, kept live
                with joined_tenant_context(membership.tenant):  # a 403 page renders outside it
                    item["pending"] = approval_selectors.pending_count()
    full = {
        "membership": membership,
        "tenant": membership.tenant if membership else None,
        "memberships": memberships_of(request.user) if request.user.is_authenticated else [],
        "nav": nav,
        "caps": ROLE_CAPABILITIES[membership.role] if membership else frozenset(),
        "section": section,
        "sweep_lagging": _sweep_lagging() if membership is not None else None,
        **(context or {}),
    }
    return render(request, template, full, status=status)


def _sweep_lagging() -> dict[str, object] | None:
    """The recovery sweep's status when it lags (every member page's banner), else None."""
    from recovery import sweeper

    try:
        found = sweeper.status()
    except Exception:  # the page still renders; /readyz and /metrics say what failed
        return None
    return found if found["status"] == "lagging" else None


def forbidden(request: HttpRequest, capability: str, section: str = "") -> HttpResponse:
    return page(request, "frontend/403.html", {"capability": capability}, section=section, status=403)


def member_page(
    access: AccessMap, section: str = "", *, transaction: bool = True
) -> Callable[[PageView], PageView]:
    """Decorator for a tenant page or action, declaring its rule per method (`tenants.access`):
    method declared (405), signed in (to the login page), a member (404), allowed (403 page),
    form read, then the view in one transaction with the tenant active (with `transaction=False`,
    outside any: the view enters the tenant around each unit of work itself; see the module). The
    view gets a `MemberRequest`."""

    def decorate(view: PageView) -> PageView:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            rule = rule_for(access, request.method or "")
            if rule is None:
                return HttpResponseNotAllowed(allowed_methods(access))
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            membership = _membership_or_404(request)
            member_request = cast(MemberRequest, request)  # made one by the next two lines
            member_request.membership = membership
            member_request.tenant = membership.tenant
            if decide(rule, membership=membership) is not None:
                return forbidden(member_request, rule.capability or "", section)
            # The form is read (bounded by DATA_UPLOAD_MAX_MEMORY_SIZE) before the transaction opens.
            member_request.POST  # noqa: B018
            if not transaction:
                return view(member_request, *args, **kwargs)
            with tenant_context(membership.tenant):
                return view(member_request, *args, **kwargs)

        wrapper.access = access  # type: ignore[attr-defined]  # read by the navigation and the tests
        return wrapper

    return decorate


def actor_of(request: HttpRequest) -> Actor:
    """Who is acting (the same person as the API mixin's)."""
    return user_actor(request.user.get_username())


# Method first, then sign-in: a method a route does not answer is a 405 for everyone.
@require_safe
@login_required
def home(request: HttpRequest) -> HttpResponse:
    _membership_or_404(request)
    return redirect("sagas")


@require_POST
@login_required
def switch_tenant(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("tenant", "")
    if membership_for(request.user, slug) is None:
        raise Http404("no such tenant for this user")
    request.session[SESSION_TENANT_KEY] = slug
    return redirect("home")
