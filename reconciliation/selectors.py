"""Read-only questions about reconciliation, for the API, the pages and the certificate. Every
query runs under the active tenant (TenantScopedModel).

`report(since, until)` is what `sagaplane reconcile --since` decides on: every step the projection
holds as compensated in the sagas active in the range, each with its check's state. A compensated
step with no check yet, or a check still open, is `pending`: never counted as confirmed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from core.errors import DomainError
from reconciliation.models import VERDICTS, CheckStatus, Reason, ReconciliationCheck
from sagas import selectors as saga_selectors
from sagas.models import StepStatus

# A report or certificate covers at most this many steps; a wider range is refused (ask for a
# narrower one with `until`), so one request's work and answer stay bounded.
MAX_STEPS = 20_000
PENDING = "pending"
OUTCOMES = (CheckStatus.CONFIRMED.value, CheckStatus.DRIFT.value, CheckStatus.UNVERIFIABLE.value, PENDING)


@dataclass(frozen=True, slots=True)
class Item:
    saga_id: str
    step_id: str
    tool: str
    handler: str
    outcome: str  # confirmed | drift | unverifiable | pending
    reason: str
    detail: str
    check_id: str | None
    decided_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {
            "saga_id": self.saga_id,
            "step_id": self.step_id,
            "tool": self.tool,
            "handler": self.handler,
            "outcome": self.outcome,
            "reason": self.reason,
            "detail": self.detail,
            "check": self.check_id,
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
        }


@dataclass
class Report:
    since: datetime
    until: datetime
    items: list[Item] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for item in self.items:
            counts[item.outcome] += 1
        return counts

    @property
    def outcome(self) -> str:
        """`drift` if any step drifted, else `unverifiable` if any is unverifiable or still
        pending, else `confirmed` (also for a range with nothing compensated: nothing to doubt)."""
        counts = self.counts
        if counts[CheckStatus.DRIFT]:
            return CheckStatus.DRIFT.value
        if counts[CheckStatus.UNVERIFIABLE] or counts[PENDING]:
            return CheckStatus.UNVERIFIABLE.value
        return CheckStatus.CONFIRMED.value


def range_too_large(steps: int) -> DomainError:
    return DomainError(
        "range_too_large",
        f"the range holds {steps} steps, more than {MAX_STEPS}: narrow it with since/until",
        field="since",
        context={"limit": MAX_STEPS},
    )


def checks_for(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ReconciliationCheck]:
    """The check of each (saga id, step id), where one exists."""
    wanted = set(pairs)
    saga_ids = sorted({saga_id for saga_id, _ in wanted})
    found: dict[tuple[str, str], ReconciliationCheck] = {}
    for start in range(0, len(saga_ids), 500):
        for check in ReconciliationCheck.objects.filter(saga_id__in=saga_ids[start : start + 500]):
            key = (check.saga_id, check.step_id)
            if key in wanted:
                found[key] = check
    return found


def item_of(saga_id: str, step_id: str, tool: str, handler: str, check: ReconciliationCheck | None) -> Item:
    if check is None:
        return Item(saga_id, step_id, tool, handler, PENDING, "not_checked_yet", "", None, None)
    outcome = check.status if check.status in VERDICTS else PENDING
    reason = check.reason if check.status in VERDICTS else check.status
    return Item(
        saga_id,
        step_id,
        tool,
        check.handler or handler,
        outcome,
        reason,
        check.detail,
        str(check.pk),
        check.decided_at,
    )


def report(since: datetime, until: datetime | None = None) -> Report:
    """Every compensated step of the sagas active in [since, until) with its check's outcome."""
    now = timezone.now()
    until = until or now
    steps = saga_selectors.step_count_between(since, until)
    if steps > MAX_STEPS:
        raise range_too_large(steps)
    effects = [
        e
        for e in saga_selectors.effects_between(since, until, now=now, limit=MAX_STEPS)
        if e.status == StepStatus.COMPENSATED
    ]
    checks = checks_for((e.saga_id, e.step_id) for e in effects)
    out = Report(since, until)
    for e in effects:
        handler = str((e.compensation or {}).get("handler") or "")
        out.items.append(item_of(e.saga_id, e.step_id, e.tool, handler, checks.get((e.saga_id, e.step_id))))
    return out


def status_counts() -> dict[str, int]:
    from django.db.models import Count

    counts = dict.fromkeys(CheckStatus.values, 0)
    for row in ReconciliationCheck.objects.order_by().values("status").annotate(n=Count("pk")):
        counts[row["status"]] = row["n"]
    return counts


def checks_in(statuses: Iterable[str]) -> QuerySet[ReconciliationCheck]:
    """The checks in any of `statuses`, unordered (the page orders and bounds them)."""
    return ReconciliationCheck.objects.filter(status__in=list(statuses))


def unobserved_handlers(limit: int = 5) -> list[tuple[str, int]]:
    """The handlers whose checks went unverifiable because no observer claimed them, the most
    such checks first: what a tenant has to run an observer for (the page's guidance)."""
    from django.db.models import Count

    rows = (
        ReconciliationCheck.objects.filter(status=CheckStatus.UNVERIFIABLE, reason=Reason.NO_OBSERVER)
        .exclude(handler="")
        .order_by()
        .values("handler")
        .annotate(n=Count("pk"))
        .order_by("-n", "handler")[:limit]
    )
    return [(row["handler"], row["n"]) for row in rows]


def check(check_id: Any) -> ReconciliationCheck | None:
    return ReconciliationCheck.objects.filter(pk=check_id).first()
