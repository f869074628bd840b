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
from frontend import paging
from frontend.views import MemberRequest, actor_of, member_page, page
from reconciliation import selectors, services
from reconciliation.models import OPEN_STATUSES, CheckStatus
from tenants.access import READ, RECONCILE_DECIDE, decide

# The lists the page shows one at a time (`?show=`), each paged by `frontend.paging`: verdicts the
# newest first, open checks by their deadline, the latest first (a check just re-opened on top).
LISTS = {
    "drift": ("Drift", [CheckStatus.DRIFT], "decided_at"),
    "unverifiable": ("Unverifiable", [CheckStatus.UNVERIFIABLE], "decided_at"),
    "open": ("Waiting for an observer", list(OPEN_STATUSES), "deadline"),
    "confirmed": ("Confirmed", [CheckStatus.CONFIRMED], "decided_at"),
}


def _shown(request: MemberRequest, counts: dict[str, int]) -> str:
    """The list asked for, else the worst news there is: drift, unverifiable, open, confirmed."""
    asked = request.GET.get("show", "")
    if asked in LISTS:
        return asked
    waiting = counts[CheckStatus.PENDING] + counts[CheckStatus.CLAIMED]
    for name, n in (("drift", counts[CheckStatus.DRIFT]), ("unverifiable", counts[CheckStatus.UNVERIFIABLE])):
        if n:
            return name
    return "open" if waiting or not counts[CheckStatus.CONFIRMED] else "confirmed"


@member_page({"GET": READ}, section="reconciliation")
def reconciliation(request: MemberRequest) -> HttpResponse:
    counts = selectors.status_counts()
    show = _shown(request, counts)
    _, statuses, time_field = LISTS[show]
    found = paging.keyset(
        request,
        selectors.checks_in(statuses),
        time_field,
        {"show": show},
    )
    waiting = counts[CheckStatus.PENDING] + counts[CheckStatus.CLAIMED]
    tabs = [
        {
            "name": name,
            "label": label,
            "count": waiting if name == "open" else counts[name],
            "current": name == show,
        }
        for name, (label, _, _) in LISTS.items()
    ]
    context = {
        "counts": counts,
        "waiting": waiting,
        "tabs": tabs,
        "show": show,
        "rows": found.rows,
        "pages": found,
        "unobserved": selectors.unobserved_handlers(5) if counts[CheckStatus.UNVERIFIABLE] else [],
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
    return redirect(reverse("reconciliation") + "?show=open#open")
