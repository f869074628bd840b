"""Reads of approvals inside the active tenant: one set of questions for the API, the dashboard and
the Slack app, so no page queries approvals' tables on its own."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from approvals.actions.requests import vote_values
from approvals.models import ApprovalPolicy, ApprovalRequest, Status, Vote

ID_MAX = 64  # a request id is 32 hex digits; a longer one in a URL names nothing
DECIDED = [Status.APPROVED, Status.DENIED, Status.EXPIRED, Status.LAPSED, Status.CONSUMED]


def request(approval_id: str) -> ApprovalRequest | None:
    """One request, by its id (None: no such request in this tenant)."""
    return ApprovalRequest.objects.filter(pk=approval_id[:ID_MAX]).first()


def requests(status: str | None = None, *, limit: int = 100) -> list[ApprovalRequest]:
    """The requests, newest first (optionally of one status)."""
    rows = ApprovalRequest.objects.order_by("-created_at", "pk")
    if status:
        rows = rows.filter(status=status)
    return list(rows[:limit])


def waiting(limit: int) -> list[ApprovalRequest]:
    """The queue: requests still open before their deadline, the nearest deadline first."""
    rows = ApprovalRequest.objects.filter(status=Status.PENDING, expires_at__gt=timezone.now())
    return list(rows.order_by("expires_at", "pk")[:limit])


def pending_count() -> int:
    """How many requests wait for a decision now (the navigation's badge)."""
    return ApprovalRequest.objects.filter(status=Status.PENDING, expires_at__gt=timezone.now()).count()


def decided(limit: int) -> list[ApprovalRequest]:
    """The history: decided requests, the latest decision first."""
    rows = ApprovalRequest.objects.filter(status__in=DECIDED)
    return list(rows.order_by("-decided_at", "-created_at", "pk")[:limit])


def votes(row: ApprovalRequest, *, choice: str | None = None) -> list[Vote]:
    """A request's votes in the order they were cast (optionally only approvals or denials)."""
    found = row.votes.all() if choice is None else row.votes.filter(choice=choice)
    return list(found.order_by("created_at", "pk"))


def for_saga(saga_id: str, limit: int = 200) -> list[ApprovalRequest]:
    """A saga's requests, in the order they were opened (its timeline shows them on their steps)."""
    rows = ApprovalRequest.objects.filter(saga_id=saga_id[: ID_MAX * 2])
    return list(rows.order_by("created_at", "pk")[:limit])


def has_voted(row: ApprovalRequest, user_id: int) -> bool:
    return row.votes.filter(user_id=user_id).exists()


def break_glass_uses(limit: int = 200) -> list[dict[str, Any]]:
    """Every break-glass approval, newest first, for review."""
    votes = Vote.objects.filter(break_glass=True).select_related("request").order_by("-created_at")[:limit]
    return [
        {
            **vote_values(v),
            "approval_id": v.request_id,
            "saga_id": v.request.saga_id,
            "tool": v.request.tool,
            "action_digest": v.request.action_digest,
        }
        for v in votes
    ]


def policies() -> list[ApprovalPolicy]:
    """The approval policies, by name."""
    return list(ApprovalPolicy.objects.order_by("name"))


def policy(policy_id: int) -> ApprovalPolicy | None:
    return ApprovalPolicy.objects.filter(pk=policy_id).first()
