"""Approvals in the dashboard: the queue (live over the websocket), one request in full, votes
(with a passkey where the policy demands it), break-glass for owners, and the history.

The queue is a live region: every approval event (opened, voted, decided, consumed) reaches the
tenant's dashboards over `ws/events`, and app.js fetches `approvals/rows` again, so a new request
appears and a decided one leaves without a reload.

A passkey vote: the page shows the exact action (tool, every argument, amount, saga, policy,
votes so far, time left) before passkeys.js asks `approvals/<id>/challenge` for a challenge
(`approvals.services.issue_vote_challenge`: SHA-256(action digest ‖ single-use nonce)) and calls
navigator.credentials.get() with it. The answer is posted to `approvals/<id>/vote` with the nonce;
here the assertion is verified (`passkeys.services.verify_assertion`: this member's live passkey,
user verified, counter growing), the nonce is checked to produce the signed challenge for this
request's action, and `approvals.services.vote` consumes the challenge and records the vote with
the assertion kept whole, so `sagaplane verify-approval` can check it offline.

Rules: every member sees the queue, requests and history (READ); voting and asking for a
challenge are APPROVAL_VOTE (the approve capability; keys never vote); break-glass is a vote
flagged as such, which `approvals.services` allows owners alone, with a written reason.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from approvals import selectors
from approvals import services as approvals
from approvals.models import ApprovalRequest, Status
from core.errors import DomainError
from core.numbers import amount_text
from frontend import paging
from frontend.views import MemberRequest, actor_of, member_page, page
from passkeys import services as passkeys
from tenants.access import APPROVAL_VOTE, READ

QUEUE_LIMIT = 200


def _request_or_404(approval_id: str) -> ApprovalRequest:
    row = selectors.request(approval_id)
    if row is None:
        raise Http404("no such approval request")
    return row


def _row(row: ApprovalRequest, membership: Any) -> dict[str, Any]:
    values = approvals.request_values(row)
    return {
        **values,
        "amount": row.action.get("amount"),
        "amount_text": amount_text(row.action.get("amount"), row.args.get("currency")),
        "args_json": json.dumps(row.args, indent=2, sort_keys=True, ensure_ascii=False),
        "can_vote": row.status == Status.PENDING and approvals.eligible(row, membership),
    }


# ------------------------------------------------------------------------------------ the queue


def _pending(request: MemberRequest) -> list[dict[str, Any]]:
    return [_row(row, request.membership) for row in selectors.waiting(QUEUE_LIMIT)]


@member_page({"GET": READ}, section="approvals")
def queue(request: MemberRequest) -> HttpResponse:
    return page(request, "frontend/approvals.html", {"rows": _pending(request)}, section="approvals")


@member_page({"GET": READ}, section="approvals")
def queue_rows(request: MemberRequest) -> HttpResponse:
    return render(request, "frontend/_approval_rows.html", {"rows": _pending(request)})


@member_page({"GET": READ}, section="approvals")
def pending_badge(request: MemberRequest) -> HttpResponse:
    """The navigation's count of pending requests (a live region: fetched again on approval events)."""
    return render(request, "frontend/_pending_badge.html", {"pending": selectors.pending_count()})


@member_page({"GET": READ}, section="approvals")
def history(request: MemberRequest) -> HttpResponse:
    found = paging.keyset(request, selectors.decided(), "decided_at", {}, text_id=True)
    return page(
        request,
        "frontend/approval_history.html",
        {
            "rows": [_row(row, request.membership) for row in found.rows],
            "pages": found,
            "break_glass": selectors.break_glass_uses(),
        },
        section="approvals",
    )


# ---------------------------------------------------------------------------------- one request


def _state(request: MemberRequest, row: ApprovalRequest) -> dict[str, Any]:
    return {
        "row": _row(row, request.membership),
        "votes": [approvals.vote_values(v) for v in selectors.votes(row)],
    }


@member_page({"GET": READ}, section="approvals")
def state(request: MemberRequest, approval_id: str) -> HttpResponse:
    """The request's status and votes: the detail page's live region (fetched again on events)."""
    return render(request, "frontend/_approval_state.html", _state(request, _request_or_404(approval_id)))


@member_page({"GET": READ}, section="approvals")
def detail(request: MemberRequest, approval_id: str) -> HttpResponse:
    row = _request_or_404(approval_id)
    voted = selectors.has_voted(row, request.user.pk)
    return page(
        request,
        "frontend/approval_detail.html",
        {
            **_state(request, row),
            "rules": row.rules,
            "voted": voted,
            "has_passkey": bool(passkeys.live_passkeys(request.user)),
            "may_break_glass": request.membership.can("break_glass") and row.status == Status.PENDING,
        },
        section="approvals",
    )


def _wants_json(request: MemberRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _refused(request: MemberRequest, approval_id: str, status: int, body: dict[str, Any]) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(body, status=status)
    messages.error(request, str(body.get("detail")))
    return redirect("approval-detail", approval_id=approval_id)


@member_page({"POST": APPROVAL_VOTE}, section="approvals")
def challenge(request: MemberRequest, approval_id: str) -> HttpResponse:
    """WebAuthn request options whose challenge is this request's, for this member, once."""
    try:
        issued = approvals.issue_vote_challenge(
            request.tenant,
            approval_id[:64],
            request.membership,
            actor=actor_of(request),
            break_glass=request.POST.get("break_glass") == "1",
        )
    except DomainError as exc:
        return JsonResponse(exc.body(), status=exc.status)
    options = passkeys.vote_options(request.user, bytes.fromhex(issued["challenge"]))
    return JsonResponse(
        {"publicKey": options, "nonce": issued["nonce"], "action_digest": issued["action_digest"]}
    )


def _passkey_assertion(request: MemberRequest, row: ApprovalRequest, credential: str) -> dict[str, Any]:
    """The verified assertion as the vote keeps it, or PasskeyRefused / DomainError."""
    signed = passkeys.assertion_challenge(credential)
    nonce_hex = request.POST.get("nonce", "")
    try:
        nonce = bytes.fromhex(nonce_hex)
    except ValueError:
        nonce = b""
    if len(nonce) != 32 or approvals.challenge_for(row.action_digest, nonce) != signed.hex():
        raise DomainError(
            "challenge_invalid", "the passkey signed no challenge for this request's action", status=403
        )
    verified = passkeys.verify_assertion(
        request.membership, signed, credential, origins=passkeys.origins_for(request)
    )
    return {**verified.as_record(), "challenge": signed.hex(), "nonce": nonce.hex()}


@member_page({"POST": APPROVAL_VOTE}, section="approvals")
def vote(request: MemberRequest, approval_id: str) -> HttpResponse:
    row = _request_or_404(approval_id)
    break_glass = request.POST.get("break_glass") == "1"
    credential = request.POST.get("credential", "")
    choice = "approve" if break_glass else request.POST.get("decision", "")
    try:
        assertion = _passkey_assertion(request, row, credential) if credential else None
        decided = approvals.vote(
            request.tenant,
            row.pk,
            request.membership,
            choice,
            request.POST.get("note", ""),
            actor=actor_of(request),
            assertion=assertion,
            break_glass=break_glass,
        )
    except DomainError as exc:
        return _refused(request, row.pk, exc.status, exc.body())
    # The outcome only when the vote decided: a count would be stale once the next vote lands (the
    # page's live section keeps the count).
    outcomes = {Status.APPROVED.value: ": approved", Status.DENIED.value: ": denied"}
    done = outcomes.get(str(decided.status), "")
    kind = "Break-glass approval" if break_glass else ("Passkey vote" if assertion else "Vote")
    messages.success(request, f"{kind} recorded{done}.")
    url = reverse("approval-detail", kwargs={"approval_id": row.pk})
    if _wants_json(request):
        return JsonResponse({"redirect": url, "status": decided.status})
    return redirect(url)
