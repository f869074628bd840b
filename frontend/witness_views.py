"""The Evidence page's witnesses: add one, remove one, set the quorum (owners and admins, the
same rule as the API, `tenants.access.WITNESSES_CHANGE`); each through `transparency.witnesses`,
audited there."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from core.errors import DomainError
from core.numbers import ascii_int
from frontend.views import MemberRequest, actor_of, member_page
from tenants.access import WITNESSES_CHANGE
from transparency import witnesses
from transparency.models import Witness


def _back() -> HttpResponse:
    return redirect(reverse("evidence") + "#witnesses-card")


@member_page({"POST": WITNESSES_CHANGE}, section="evidence")
def witness_add(request: MemberRequest) -> HttpResponse:
    post = request.POST
    try:
        new = witnesses.WitnessAdd.parse(
            {name: post.get(name, "").strip() for name in ("name", "url", "vkey")}
        )
        witness = witnesses.add_witness(request.tenant, new, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, f"Witness not added: {refused.detail}")
        return _back()
    messages.success(request, f"Witness {witness.name} added: it is sent the next checkpoint.")
    return _back()


@member_page({"POST": WITNESSES_CHANGE}, section="evidence")
def witness_remove(request: MemberRequest, witness_id: int) -> HttpResponse:
    if not Witness.objects.filter(pk=witness_id).exists():  # another tenant's id: not found
        raise Http404("no such witness")
    try:
        witnesses.remove_witness(request.tenant, witness_id, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, f"Witness not removed: {refused.detail}")
        return _back()
    messages.success(request, "Witness removed; its cosignatures stay on the checkpoints they signed.")
    return _back()


@member_page({"POST": WITNESSES_CHANGE}, section="evidence")
def witness_quorum(request: MemberRequest) -> HttpResponse:
    raw = request.POST.get("quorum", "").strip()
    number = ascii_int(raw, max_digits=9)
    try:
        terms = witnesses.QuorumSet.parse({"quorum": raw if number is None else number})
        quorum = witnesses.set_quorum(request.tenant, terms, actor=actor_of(request))
    except DomainError as refused:
        messages.error(request, f"Quorum not set: {refused.detail}")
        return _back()
    messages.success(request, f"Quorum set: {quorum} witness(es) must cosign a checkpoint.")
    return _back()
