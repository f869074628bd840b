"""Votes: who may vote on a request, passkey challenges, and the vote that decides it.

Racing votes are serialised on the request's row: it is decided once.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane.events import Event

from approvals.actions.requests import announce, decide, record
from approvals.inputs import NOTE_MAX
from approvals.models import ApprovalRequest, Status, Vote, VoteChallenge, VoteChoice
from core.actors import Actor
from core.errors import DomainError
from core.scoping import require_tenant
from tenants.actors import user_actor
from tenants.models import Membership, Tenant

ASSERTION_MAX_BYTES = 32 * 1024
CHALLENGE_TTL = timedelta(minutes=5)


def _voter(member: Membership) -> str:
    """The member as the vote and the request's decided_by store them."""
    return str(user_actor(member.user.get_username()))


def eligible(row: ApprovalRequest, member: Membership) -> bool:
    """May this member's vote count? The policy's group, widened by each escalation level reached;
    always someone whose role may approve, and never the requester (the asking key's owner)."""
    if not member.can("approve") or row.requester_user_id == member.user_id:
        return False
    roles = set(row.rules.get("eligible_roles", []))
    members = set(row.rules.get("eligible_members", []))
    for level in row.rules.get("escalation", [])[: row.escalation_level]:
        roles |= set(level.get("roles", []))
        members |= set(level.get("members", []))
    return member.role in roles or member.user_id in members


def _check_voter(row: ApprovalRequest, member: Membership, *, break_glass: bool) -> None:
    if row.requester_user_id is not None and row.requester_user_id == member.user_id:
        raise DomainError(
            "requester_cannot_vote", "the requester (the asking key's owner) cannot vote", status=403
        )
    if break_glass:
        if not member.can("break_glass"):
            raise DomainError(
                "break_glass_forbidden", f"the role '{member.role}' may not break glass", status=403
            )
        return
    if not eligible(row, member):
        raise DomainError("not_eligible", "this member is not among the request's approvers", status=403)


def _check_open(row: ApprovalRequest, now: datetime) -> None:
    if row.status != Status.PENDING:
        raise DomainError("already_decided", f"the request is {row.status}", status=409)
    if row.expires_at <= now:
        raise DomainError("expired", "the request expired without a decision", status=409)


def _text(value: Any, field: str, *, limit: int = NOTE_MAX) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise DomainError("invalid", f"{field}: a string of at most {limit} characters", field=field)
    return value


def _member_here(tenant: Tenant, member: Membership) -> Membership:
    """The member as they stand now in this tenant (removed since, or of another tenant: refused)."""
    current = Membership.objects.select_related("user").filter(pk=member.pk, user_id=member.user_id).first()
    if current is None or member.tenant_id != tenant.pk:
        raise DomainError("not_a_member", "the voter is not a member of this tenant", status=403)
    return current


def challenge_for(action_digest: str, nonce: bytes) -> str:
    """The WebAuthn challenge of a passkey vote: SHA-256(action digest ‖ server nonce), hex."""
    return hashlib.sha256(bytes.fromhex(action_digest) + nonce).hexdigest()


def issue_vote_challenge(
    tenant: Tenant, request_id: str, member: Membership, *, actor: Actor, break_glass: bool = False
) -> dict[str, Any]:
    """A single-use challenge for this member's passkey vote on this request (valid 5 minutes).
    The authenticator signs `challenge` (32 bytes, hex here); `vote(..., assertion=...)` consumes
    it. The passkeys app verifies the WebAuthn assertion against these bytes."""
    now = timezone.now()
    require_tenant(tenant)
    with transaction.atomic():
        row = ApprovalRequest.objects.filter(pk=request_id).first()
        if row is None:
            raise DomainError("not_found", "no such approval request", status=404)
        current = _member_here(tenant, member)
        _check_open(row, now)
        _check_voter(row, current, break_glass=break_glass)
        nonce = secrets.token_bytes(32)
        challenge = challenge_for(row.action_digest, nonce)
        VoteChallenge.objects.create(
            request=row,
            user=current.user,
            nonce=nonce.hex(),
            challenge=challenge,
            expires_at=now + CHALLENGE_TTL,
        )
    return {
        "approval_id": row.pk,
        "challenge": challenge,
        "nonce": nonce.hex(),
        "action_digest": row.action_digest,
        "action": row.action,
        "expires_at": (now + CHALLENGE_TTL).isoformat(),
    }


def _take_challenge(
    row: ApprovalRequest, member: Membership, assertion: Any, now: datetime
) -> dict[str, Any]:
    """Consume the member's open challenge the (verified) assertion answers; the assertion is kept
    with the challenge and its nonce, so the vote can be verified again offline."""
    if not isinstance(assertion, dict) or not isinstance(assertion.get("challenge"), str):
        raise DomainError("invalid_assertion", "the assertion must name its challenge", field="assertion")
    if len(json.dumps(assertion, default=str)) > ASSERTION_MAX_BYTES:
        raise DomainError("invalid_assertion", "the assertion is too large", field="assertion")
    issued = VoteChallenge.objects.filter(
        request=row,
        user_id=member.user_id,
        challenge=assertion["challenge"].lower(),
        used_at__isnull=True,
        expires_at__gt=now,
    ).first()
    if issued is None or not VoteChallenge.objects.filter(pk=issued.pk, used_at__isnull=True).update(
        used_at=now
    ):
        raise DomainError(
            "challenge_invalid",
            "the assertion answers no open challenge of this member for this request",
            status=403,
        )
    kept: dict[str, Any] = json.loads(json.dumps(assertion, default=str))
    kept.update(challenge=issued.challenge, nonce=issued.nonce)
    return kept


def check_votable(tenant: Tenant, request_id: str, member: Membership) -> None:
    """Refuse as `vote` refuses before it judges the vote itself: a voter who is no longer a
    member (403), no such request (404). The API judges the vote's choice and note after this,
    so those refusals keep coming after the 404, as they do in `vote`."""
    require_tenant(tenant)
    _member_here(tenant, member)
    if not ApprovalRequest.objects.filter(pk=request_id).exists():
        raise DomainError("not_found", "no such approval request", status=404)


def vote(
    tenant: Tenant,
    request_id: str,
    member: Membership,
    choice: Any,
    note: Any = "",
    *,
    actor: Actor,
    assertion: dict[str, Any] | None = None,
    break_glass: bool = False,
) -> ApprovalRequest:
    """One member's vote. The first vote of a member counts (a second is refused); an eligible
    deny denies; `required` approvals approve; break-glass (owners only, with a written reason)
    approves at once and is recorded as such. A passkey-only policy needs `assertion`: a WebAuthn
    assertion the passkeys app has verified against a challenge from `issue_vote_challenge`.
    Racing votes are serialised on the request's row: it is decided once."""
    now = timezone.now()
    require_tenant(tenant)
    with transaction.atomic():
        current = _member_here(tenant, member)
        row = ApprovalRequest.objects.select_for_update().filter(pk=request_id).first()
        if row is None:
            raise DomainError("not_found", "no such approval request", status=404)
        if choice not in VoteChoice.values:
            raise DomainError("invalid", "choice: approve or deny", field="choice")
        note = _text(note, "note")
        if break_glass and (choice != VoteChoice.APPROVE or not note.strip()):
            raise DomainError("reason_required", "break-glass approves, with a written reason", field="note")
        _check_open(row, now)
        _check_voter(row, current, break_glass=break_glass)
        kept: dict[str, Any] | None = None
        if assertion is not None:
            kept = _take_challenge(row, current, assertion, now)
        elif row.rules.get("passkey_only"):
            raise DomainError("passkey_required", "this policy takes passkey votes only", status=403)
        _count(
            tenant, row, current, choice, note, assertion=kept, break_glass=break_glass, now=now, actor=actor
        )
    return row


def _count(
    tenant: Tenant,
    row: ApprovalRequest,
    member: Membership,
    choice: str,
    note: str,
    *,
    assertion: dict[str, Any] | None,
    break_glass: bool,
    now: datetime,
    actor: Actor,
) -> None:
    """Keep a checked vote (a member's second is refused) and its record; a deny denies the
    request, the approval that completes the count (or break-glass) approves it."""
    voter = _voter(member)
    try:
        with transaction.atomic():
            Vote.objects.create(
                request=row,
                user=member.user,
                voter=voter,
                role=member.role,
                choice=choice,
                note=note,
                break_glass=break_glass,
                assertion=assertion,
                created_at=now,
            )
    except IntegrityError:
        raise DomainError("already_voted", "this member has voted on this request", status=409) from None
    record(
        tenant,
        Event.APPROVAL_BREAK_GLASS if break_glass else Event.APPROVAL_VOTE,
        row,
        {
            "voter": voter,
            "role": member.role,
            "choice": choice,
            "note": note,
            "assertion": assertion,
            "requires_review": break_glass,
        },
        actor=actor,
    )
    announce(tenant, row, "voted", {"voter": voter, "choice": choice, "break_glass": break_glass})
    if choice == VoteChoice.DENY:
        decide(tenant, row, Status.DENIED, now, by=voter, note=note, actor=actor)
    else:
        row.approvals += 1
        row.save(update_fields=["approvals"])
        if break_glass or row.approvals >= row.required:
            row.break_glass = break_glass
            row.execute_by = now + timedelta(seconds=int(row.rules.get("execution_window_s", 300)))
            decide(tenant, row, Status.APPROVED, now, by=voter, note=note, actor=actor)
