"""The sweep: deadlines, warnings, escalation and lapsed approvals, for one tenant at a time.

Every transition is a conditional UPDATE, so a vote or a gate call racing the sweep wins or loses
whole."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone
from sagaplane.events import Event

from approvals.actions.requests import announce, record, seconds_left
from approvals.models import ApprovalRequest, Status
from core.actors import Actor
from core.scoping import require_tenant
from tenants.actors import named_actor
from tenants.models import Tenant

SWEEP_BATCH = 500
SWEEP_ACTOR = named_actor("approvals-sweep")


def sweep(tenant: Tenant, *, now: datetime | None = None, actor: Actor = SWEEP_ACTOR) -> dict[str, int]:
    """Deadlines, warnings and escalation for one tenant (the beat runs it every few seconds):
    an open request past its deadline is expired (denied); one within `warn_before_s` of it is
    warned once; escalation levels whose delay has passed are reached in order; an approval not
    used in its execution window lapses."""
    now = now or timezone.now()
    done = {"expired": 0, "warned": 0, "escalated": 0, "lapsed": 0}
    require_tenant(tenant)
    done["expired"] = _expire_overdue(tenant, now, actor=actor)
    done["lapsed"] = _lapse_unused(tenant, now, actor=actor)
    for row in ApprovalRequest.objects.filter(status=Status.PENDING, expires_at__gt=now).order_by(
        "expires_at"
    )[:SWEEP_BATCH]:
        done["escalated"] += _escalate(tenant, row, now, actor=actor)
        done["warned"] += _warn(tenant, row, now, actor=actor)
    return done


def _expire_overdue(tenant: Tenant, now: datetime, *, actor: Actor) -> int:
    """Open requests past their deadline: expired, a denial."""
    expired = 0
    for row in ApprovalRequest.objects.filter(status=Status.PENDING, expires_at__lte=now)[:SWEEP_BATCH]:
        if ApprovalRequest.objects.filter(pk=row.pk, status=Status.PENDING).update(
            status=Status.EXPIRED,
            decided_at=now,
            decided_by="deadline",
            note="expired without a decision",
        ):
            row.refresh_from_db()
            record(
                tenant,
                Event.APPROVAL_EXPIRED,
                row,
                {"approvals": row.approvals, "required": row.required},
                actor=actor,
            )
            announce(tenant, row, "decided")
            expired += 1
    return expired


def _lapse_unused(tenant: Tenant, now: datetime, *, actor: Actor) -> int:
    """Approvals not used within their execution window: lapsed."""
    lapsed = 0
    for row in ApprovalRequest.objects.filter(status=Status.APPROVED, execute_by__lte=now)[:SWEEP_BATCH]:
        if ApprovalRequest.objects.filter(pk=row.pk, status=Status.APPROVED, execute_by__lte=now).update(
            status=Status.LAPSED
        ):
            row.refresh_from_db()
            record(
                tenant,
                Event.APPROVAL_LAPSED,
                row,
                {"execute_by": row.execute_by.isoformat() if row.execute_by else None},
                actor=actor,
            )
            announce(tenant, row, "decided")
            lapsed += 1
    return lapsed


def _escalate(tenant: Tenant, row: ApprovalRequest, now: datetime, *, actor: Actor) -> int:
    """Reach the escalation levels whose delay has passed (1: this request escalated now)."""
    elapsed = (now - row.created_at).total_seconds()
    levels = row.rules.get("escalation", [])
    reached = sum(1 for level in levels if elapsed >= level.get("after_s", 0))
    if reached <= row.escalation_level or not ApprovalRequest.objects.filter(
        pk=row.pk, status=Status.PENDING, escalation_level=row.escalation_level
    ).update(escalation_level=reached):
        return 0
    level = levels[reached - 1]
    row.escalation_level = reached
    notify = {
        "level": reached,
        "roles": level.get("roles", []),
        "members": level.get("members", []),
    }
    record(tenant, Event.APPROVAL_ESCALATED, row, notify, actor=actor)
    announce(tenant, row, "escalated", notify)
    return 1


def _warn(tenant: Tenant, row: ApprovalRequest, now: datetime, *, actor: Actor) -> int:
    """Warn once, `warn_before_s` before the deadline (1: this request warned now)."""
    warn_at = row.expires_at - timedelta(seconds=int(row.rules.get("warn_before_s", 0)))
    if (
        row.warned_at is not None
        or warn_at > now
        or not ApprovalRequest.objects.filter(
            pk=row.pk, status=Status.PENDING, warned_at__isnull=True
        ).update(warned_at=now)
    ):
        return 0
    row.warned_at = now
    detail = {
        "expires_at": row.expires_at.isoformat(),
        "expires_in": seconds_left(row.expires_at, now),
        "approvals": row.approvals,
        "required": row.required,
    }
    record(tenant, Event.APPROVAL_WARNING, row, detail, actor=actor)
    announce(tenant, row, "warned", detail)
    return 1
