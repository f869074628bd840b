"""Reconciliation checks as leased work (`core.claims`): who may claim a check, and the claim."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.claims import Leased
from core.claims import claim as claim_rows
from core.scoping import current_tenant
from reconciliation.models import CheckStatus, ReconciliationCheck

WORKER_MAX = 200


def _lease() -> timedelta:
    return timedelta(seconds=settings.SAGAPLANE_RECONCILE_LEASE_SECONDS)


# A check's lease (core.claims): a claim takes a pending check, or a claimed one whose lease lapsed.
CHECKS = Leased(
    ReconciliationCheck,
    state="status",
    claimed=CheckStatus.CLAIMED,
    claimable=(CheckStatus.PENDING, CheckStatus.CLAIMED),
    token="token",
    holder="claimed_by",
    lease="lease_expires_at",
    holder_max=WORKER_MAX,
)


def claim_due(handlers: list[str] | None, *, worker: str, limit: int) -> list[ReconciliationCheck]:
    """In the active tenant: claim due checks of `handlers` (None: any handler), oldest due first,
    in one conditional UPDATE guarded by each check's token as picked (`core.claims.claim`):
    where the database has no row locks (SQLite) a racing claimer's update wins and this one
    skips the check."""

    def due(now: datetime) -> QuerySet[ReconciliationCheck]:
        claimable = Q(status=CheckStatus.PENDING) | Q(status=CheckStatus.CLAIMED, lease_expires_at__lte=now)
        found = ReconciliationCheck.objects.filter(claimable, not_before__lte=now, deadline__gt=now)
        found = found.filter(handler__in=handlers) if handlers is not None else found.exclude(handler="")
        return found.order_by("not_before")

    now = timezone.now()
    return claim_rows(
        CHECKS,
        due,
        now=now,
        holder=worker,
        lease_until=now + _lease(),
        limit=limit,
        shape=(current_tenant().pk, None if handlers is None else tuple(handlers)),
    )
