"""Server-rendered pages. They read through services and the tenant mixin's rules, never around them."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from tenants.api import SESSION_TENANT_KEY, membership_for, memberships_of
from tenants.scoping import tenant_context


def _membership_or_404(request: HttpRequest) -> Any:
    membership = membership_for(request.user, request.session.get(SESSION_TENANT_KEY))
    if membership is None:
        memberships = memberships_of(request.user)
        if not memberships:
            raise Http404("you are not a member of any tenant")
        membership = memberships[0]
        request.session[SESSION_TENANT_KEY] = membership.tenant.slug
    return membership


@login_required
def home(request: HttpRequest) -> HttpResponse:
    membership = _membership_or_404(request)
    with tenant_context(membership.tenant):
        context = {
            "membership": membership,
            "memberships": memberships_of(request.user),
        }
        return render(request, "frontend/home.html", context)


@login_required
@require_POST
def switch_tenant(request: HttpRequest) -> HttpResponse:
    slug = request.POST.get("tenant", "")
    if membership_for(request.user, slug) is None:
        raise Http404("no such tenant for this user")
    request.session[SESSION_TENANT_KEY] = slug
    return redirect("home")
