"""Read-only questions about sagas, for the API and the pages alike (they never query the
projection's models themselves). Every query runs under the active tenant (TenantScopedModel).

A saga's *effective* status is what the records say, except that a running saga whose lease has
lapsed is orphaned (time passing is not a record, so it is not projected): `Saga.effective_status`
answers it for one saga and `with_effective_status` as a query; a test holds the two together.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet

from sagas.models import Saga, SagaStatus, Step


def _lapsed(now: datetime) -> Q:
    return Q(status=SagaStatus.RUNNING, lease_expires_at__lt=now)


def with_effective_status(sagas: QuerySet[Saga], status: str, now: datetime) -> QuerySet[Saga]:
    """The sagas among `sagas` whose `effective_status(now)` is `status` (all of them for "")."""
    if not status:
        return sagas
    if status == SagaStatus.ORPHANED:
        return sagas.filter(_lapsed(now) | Q(status=SagaStatus.ORPHANED))
    if status == SagaStatus.RUNNING:
        return sagas.filter(status=SagaStatus.RUNNING).exclude(_lapsed(now))
    return sagas.filter(status=status)


def effective_status_counts(sagas: QuerySet[Saga], now: datetime) -> dict[str, int]:
    """How many of `sagas` have each effective status (every status present, 0 when none)."""
    counts = dict.fromkeys(SagaStatus.values, 0)
    for row in sagas.order_by().values("status").annotate(n=Count("pk", distinct=True)):
        counts[row["status"]] = counts.get(row["status"], 0) + row["n"]
    lapsed = sagas.filter(_lapsed(now)).count()
    counts[SagaStatus.RUNNING] -= lapsed
    counts[SagaStatus.ORPHANED] += lapsed
    return counts


def all_sagas() -> QuerySet[Saga]:
    return Saga.objects.all()


def saga(saga_id: str) -> Saga | None:
    """The active tenant's saga of that id (another tenant's id is simply not found)."""
    return Saga.objects.filter(saga_id=saga_id).first()


def steps_of(saga: Saga) -> list[Step]:
    return list(saga.steps.order_by("ordinal"))


def sagas_with_steps(saga_ids: list[str]) -> dict[str, tuple[Saga, list[Step]]]:
    """Saga id → (saga, its steps in order), for many sagas in two queries (recovery's sweep)."""
    sagas = {saga.pk: saga for saga in Saga.objects.filter(saga_id__in=saga_ids)}
    steps: dict[int, list[Step]] = {pk: [] for pk in sagas}
    for step in Step.objects.filter(saga_id__in=list(sagas)).order_by("saga_id", "ordinal"):
        steps[step.saga_id].append(step)
    return {saga.saga_id: (saga, steps[pk]) for pk, saga in sagas.items()}


def with_step_tool(sagas: QuerySet[Saga], tool: str) -> QuerySet[Saga]:
    """The sagas among `sagas` with a step using `tool`: a semi-join (EXISTS) on the tenant's steps,
    so no row is repeated and no DISTINCT sorts the tenant's sagas. A join with DISTINCT (the old
    form) grew with the tenant's records: 1.5 s at 6,000 records, 15 s at 20,000."""
    return sagas.filter(Exists(Step.objects.filter(saga=OuterRef("pk"), tool=tool)))


# The list's tool filter, page by page (`newest_page`): walk at most WALK sagas newest first,
# probing each one's steps; a tool too rare to fill a page within them is answered from the
# (tenant, tool, saga) index instead, when it names at most IDS_CAP sagas.
WALK = 5_000
IDS_CAP = 20_000


def newest_page(
    sagas: QuerySet[Saga], *, tool: str, position: tuple[datetime | None, int] | None, limit: int
) -> list[Saga]:
    """The first `limit` sagas of `sagas` in `newest_first` order after `position` (a keyset, or
    None for the first page), with a step using `tool` when one is given.

    By tool, Postgres' planner has two ways, and which is cheaper turns on how rare the tool is:
    walking the sagas newest first and probing each one's steps (a common tool: the page fills
    within a few hundred sagas), or reading the tool's sagas from the step index and sorting them
    (a rare one). It chooses by its estimates, and at 10M records it chose the walk for a tool one
    saga in a thousand used: 136,000 probes, 0.5 s. So the choice is made here, by trying: a walk
    bounded to WALK sagas first (cheap when it fills the page: 4 ms for the whole walk at 10M
    records), then the index (17 ms for a tool 1,670 sagas of 1.67M used)."""
    if position is not None:
        sagas = after(sagas, *position)
    if not tool:
        return list(newest_first(sagas)[:limit])
    uses = Exists(Step.objects.filter(saga=OuterRef("pk"), tool=tool))
    walk = newest_first(sagas.annotate(uses_tool=uses))[:WALK]
    sql, params = walk.query.sql_with_params()
    # A filter over the ordered, limited walk keeps its order and stops at `limit` hits: at most
    # WALK probes, usually `limit` and a few.
    found = list(
        Saga.objects.raw(f"SELECT * FROM ({sql}) walk WHERE walk.uses_tool LIMIT %s", [*params, limit])
    )
    if len(found) == limit:
        return found
    ids = Step.objects.filter(tool=tool).order_by().values_list("saga_id", flat=True).distinct()
    if connection.vendor != "postgresql":
        return list(newest_first(sagas.filter(pk__in=ids))[:limit])
    listed = list(ids[: IDS_CAP + 1])
    if len(listed) > IDS_CAP:  # common overall, yet not among the newest WALK: the planner decides
        return list(newest_first(sagas.filter(uses))[:limit])
    # One array parameter, so the plan is primary-key lookups and a top-N sort (an IN list of
    # thousands of parameters costs more to plan than to run: 22-120 ms against 17 at 10M records).
    table = connection.ops.quote_name(Saga._meta.db_table)
    return list(newest_first(sagas.extra(where=[f"{table}.id = ANY(%s)"], params=[listed]))[:limit])


def newest_first(sagas: QuerySet[Saga]) -> QuerySet[Saga]:
    """Most recently active first (sagas with no activity time before all others on every
    database), ties newest id first: the order of the indexes ending in (last_activity_at, id)."""
    return sagas.order_by(F("last_activity_at").desc(nulls_first=True), "-pk")


def after(sagas: QuerySet[Saga], last_activity_at: datetime | None, pk: int) -> QuerySet[Saga]:
    """The sagas of `sagas` that come after (last_activity_at, pk) in `newest_first` order: the
    keyset of the next page. The redundant upper bound lets the database start the index range
    there instead of filtering from the newest saga."""
    if last_activity_at is None:
        return sagas.filter(Q(last_activity_at=None, pk__lt=pk) | Q(last_activity_at__isnull=False))
    return sagas.filter(last_activity_at__lte=last_activity_at).filter(
        Q(last_activity_at__lt=last_activity_at) | Q(last_activity_at=last_activity_at, pk__lt=pk)
    )


def filtered(*, tool: str = "", stream_id: str = "", active_since: datetime | None = None) -> QuerySet[Saga]:
    """Sagas with a step using `tool`, written to stream `stream_id`, active since `active_since`
    (each filter left out when empty)."""
    sagas = all_sagas()
    if tool:
        sagas = with_step_tool(sagas, tool)
    if stream_id:
        sagas = sagas.filter(stream_id=stream_id)
    if active_since is not None:
        sagas = sagas.filter(last_activity_at__gte=active_since)
    return sagas


def newest_first_with_step_counts(sagas: QuerySet[Saga]) -> QuerySet[Saga]:
    """Most recently active first, each saga with `step_count`."""
    return newest_first(sagas.annotate(step_count=Count("steps", distinct=True)))


def step_tools(limit: int = 200) -> list[str]:
    """Tool names any step used, sorted (for a filter's choices)."""
    return list(
        Step.objects.exclude(tool="").order_by("tool").values_list("tool", flat=True).distinct()[:limit]
    )


def stream_agents(limit: int = 400) -> list[tuple[str, str]]:
    """(stream id, agent name or "") pairs the sagas name, by stream id."""
    return list(
        Saga.objects.order_by("stream_id", "agent").values_list("stream_id", "agent").distinct()[:limit]
    )


def started_sagas_active_since(since: datetime, limit: int) -> list[Saga]:
    """Sagas with a start, active since `since`, in order of start (at most `limit`)."""
    return list(
        Saga.objects.filter(last_activity_at__gte=since)
        .exclude(started_at=None)
        .order_by("started_at")[:limit]
    )


def step_outcomes_by_tool(active_since: datetime) -> list[tuple[str, str, int]]:
    """(tool, step status, how many) over the steps of sagas active since `active_since`."""
    rows = (
        Step.objects.filter(saga__last_activity_at__gte=active_since)
        .order_by()
        .values_list("tool", "status")
        .annotate(n=Count("pk"))
    )
    return [(tool, status, n) for tool, status, n in rows]


def step_compensations(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any] | None]:
    """The compensation descriptor (`Step.compensation`) of each (saga id, step id) that names a
    projected step; pairs with no step are left out."""
    if not pairs:
        return {}
    saga_ids = {saga_id for saga_id, _ in pairs}
    wanted = set(pairs)
    rows = Step.objects.filter(saga__saga_id__in=saga_ids, step_id__in={s for _, s in pairs}).values_list(
        "saga__saga_id", "step_id", "compensation"
    )
    return {(saga_id, step_id): comp for saga_id, step_id, comp in rows if (saga_id, step_id) in wanted}


@dataclass(frozen=True, slots=True)
class Effect:
    """One step of a saga as the projection holds it, with its saga's effective status."""

    saga_id: str
    saga_status: str
    step_id: str
    tool: str
    semantics: str
    status: str
    compensation: dict[str, Any] | None


def sagas_active_between(since: datetime, until: datetime) -> QuerySet[Saga]:
    return Saga.objects.filter(last_activity_at__gte=since, last_activity_at__lt=until)


def step_count_between(since: datetime, until: datetime) -> int:
    return Step.objects.filter(saga__last_activity_at__gte=since, saga__last_activity_at__lt=until).count()


def effects_between(since: datetime, until: datetime, *, now: datetime, limit: int) -> list[Effect]:
    """Every step of the sagas active in [since, until), saga by saga in order of activity, steps
    in their order (at most `limit`)."""
    rows = (
        Step.objects.filter(saga__last_activity_at__gte=since, saga__last_activity_at__lt=until)
        .select_related("saga")
        .order_by("saga__last_activity_at", "saga__pk", "ordinal")[:limit]
    )
    return [
        Effect(
            s.saga.saga_id,
            s.saga.effective_status(now),
            s.step_id,
            s.tool,
            s.semantics,
            s.status,
            s.compensation if isinstance(s.compensation, dict) else None,
        )
        for s in rows
    ]
