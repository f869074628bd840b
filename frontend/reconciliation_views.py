"""Reconciliation: the drift report. Every compensated step's verdict from its observer, drift
first (a "compensated" effect the outside world still shows), then unverifiable ones (nobody
could tell), then checks still waiting; risk staff can re-open a verdict after a fix.

Reads through `reconciliation.selectors`; re-opening goes through `reconciliation.services.recheck`
(actor `user:<name>`, recorded in the server stream). Same named rules as the API: READ to see,
RECONCILE_DECIDE to re-open."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from core.errors import DomainError
from frontend.views import MemberRequest, actor_of, member_page, page
from reconciliation import selectors, services
from reconciliation.models import CheckStatus
from tenants.access import READ, RECONCILE_DECIDE, decide

SHOWN = 200


@member_page({"GET": READ}, section="reconciliation")
def reconciliation(request: MemberRequest) -> HttpResponse:
    attention = selectors.checks_needing_attention(SHOWN)
    context = {
        "counts": selectors.status_counts(),
        "drift": [c for c in attention if c.status == CheckStatus.DRIFT],
        "unverifiable": [c for c in attention if c.status == CheckStatus.UNVERIFIABLE],
        "open": selectors.open_checks(50),
        "may_recheck": decide(RECONCILE_DECIDE, membership=request.membership) is None,
    }
    return page(request, "frontend/reconciliation.html", context, section="reconciliation")


@member_page({"POST": RECONCILE_DECIDE}, section="reconciliation")
def recheck(request: MemberRequest, check_id: str) -> HttpResponse:
    try:
        pk = uuid.UUID(check_id)
    except ValueError:
        raise Http404("no such check") from None
    if selectors.check(pk) is None:
        raise Http404("no such check")
    try:
        check = services.recheck(request.tenant, pk, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, refused.detail)
        return redirect("reconciliation")
    messages.success(request, f"Re-opened: the observers of {check.handler} will be asked again.")
    return redirect(reverse("reconciliation") + "#open")
