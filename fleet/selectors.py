"""Read-only questions other apps ask the fleet (recovery: which sagas are set aside). Every
query runs under the active tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from fleet.models import Decision, GateDecision, Halt, Quarantine


def quarantined_saga_ids() -> QuerySet[Quarantine, str]:
    """Ids of the active tenant's sagas under a quarantine in force, as a query (usable as a
    subquery: `exclude(saga_id__in=quarantined_saga_ids())`)."""
    return Quarantine.objects.filter(released_at__isnull=True).values_list("saga_id", flat=True)


def is_quarantined(saga_id: str) -> bool:
    return quarantined_saga_ids().filter(saga_id=saga_id).exists()


def quarantine_of(saga_id: str) -> Quarantine | None:
    """The quarantine in force for this saga of the active tenant, if any."""
    return Quarantine.objects.filter(saga_id=saga_id, released_at__isnull=True).first()


def halt_history(*, before: tuple[datetime, Any] | None = None, limit: int = 50) -> list[Halt]:
    """Every kill switch, in force or not (lifted, lapsed), the latest engaged first; `before`
    is the (created_at, id) of the last one of the page before (keyset)."""
    rows = Halt.objects.order_by("-created_at", "-pk")
    if before is not None:
        rows = rows.filter(Q(created_at__lt=before[0]) | Q(created_at=before[0], pk__lt=before[1]))
    return list(rows[:limit])


def denials(
    *,
    tool: str = "",
    agent: str = "",
    reason: str = "",
    source: str = "",
    since: datetime | None = None,
    before: tuple[datetime, Any] | None = None,
    limit: int = 50,
) -> list[GateDecision]:
    """Every refusal, the gate's and those the agents' SDKs made on their own (`source`, projected
    from their GATE_DENY records by `fleet.actions.agent_denials`), the latest first, narrowed by
    tool, agent, reason, source and time; `before` is the (decided_at, id) of the last one of the
    page before (keyset)."""
    rows = GateDecision.objects.filter(decision=Decision.DENY)
    if since is not None:
        rows = rows.filter(decided_at__gte=since)
    for column, value in (("tool", tool), ("agent", agent), ("reason", reason), ("source", source)):
        if value:
            rows = rows.filter(**{column: value})
    if before is not None:
        rows = rows.filter(Q(decided_at__lt=before[0]) | Q(decided_at=before[0], pk__lt=before[1]))
    return list(rows.order_by("-decided_at", "-pk")[:limit])
