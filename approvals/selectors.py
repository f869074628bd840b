"""Reads of approvals inside the active tenant: one set of questions for the API, the dashboard and
the Slack app, so no page queries approvals' tables on its own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from approvals.actions.policies import call_matches
from approvals.actions.requests import vote_values
from approvals.models import ApprovalPolicy, ApprovalRequest, PolicyVersion, Status, Vote
from audit import selectors as audit_selectors
from audit.selectors import StepCall

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


def decided() -> QuerySet[ApprovalRequest]:
    """The history: decided requests (the console pages them, the latest decision first)."""
    return ApprovalRequest.objects.filter(status__in=DECIDED)


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


def policy_versions(policy_id: int, limit: int = 200) -> list[PolicyVersion]:
    """A policy's kept versions, the newest first (kept since versions were recorded)."""
    rows = PolicyVersion.objects.filter(policy_pk=policy_id).order_by("-version")
    return list(rows[:limit])


PREVIEW_SCAN = 5000  # records read at most, whatever the log's size
PREVIEW_EXAMPLES = 5


@dataclass(frozen=True)
class Preview:
    """What terms would have matched among the last day's step calls: how many of how many read,
    a few examples, and whether older calls of the day were beyond the records read."""

    matched: int
    read: int
    examples: list[StepCall]
    partial: bool


def would_match(tool: str, semantics: list[str], conditions: list[dict[str, Any]]) -> Preview:
    """The terms (checked: `approvals.inputs`) against the tenant's step calls of the last 24 hours,
    as their agents recorded them (bounded: `PREVIEW_SCAN` records)."""
    since = timezone.now() - timedelta(days=1)
    calls, partial = audit_selectors.step_calls_since(since, PREVIEW_SCAN)
    matched = [c for c in calls if call_matches(tool, semantics, conditions, c.tool, c.semantics, c.kwargs)]
    return Preview(len(matched), len(calls), matched[:PREVIEW_EXAMPLES], partial)
