"""Read-only questions about sagas, for the API and the pages alike (they never query the
projection's models themselves). Every query runs under the active tenant (TenantScopedModel).

A saga's *effective* status is what the records say, except that a running saga whose lease has
lapsed is orphaned (time passing is not a record, so it is not projected): `Saga.effective_status`
answers it for one saga and `with_effective_status` as a query (`started_sagas_active_since`
selects it by the same `_lapsed`); a test holds them together.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Value,
    When,
)

from core.numbers import ascii_int
from core.scoping import current_tenant
from sagas import queries
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


@dataclass(frozen=True, slots=True)
class BoundedCount:
    """A count that stopped at its bound: `n` exactly, or at least `n` when `more`."""

    n: int
    more: bool = False

    def __add__(self, other: BoundedCount) -> BoundedCount:
        return BoundedCount(self.n + other.n, self.more or other.more)

    def capped(self, cap: int) -> BoundedCount:
        return BoundedCount(cap, True) if self.n > cap else self


# A count reads at most COUNT_WALK sagas of one index range when each must be probed (a tool or a
# stream filter); a count of an index range alone stops at its cap.
COUNT_WALK = 5_000


def bounded_status_counts(
    sagas: QuerySet[Saga],
    now: datetime,
    *,
    cap: int,
    hit: Q | Exists | None = None,
    statuses: Iterable[str] = SagaStatus.values,
) -> dict[str, BoundedCount]:
    """How many of `sagas` have each of `statuses` as their effective status, counting at most
    `cap` of each (past it `BoundedCount(cap, more=True)`) and, with `hit`, only the sagas it
    holds for among the newest COUNT_WALK of each status (a lower bound when there were more).
    Each count reads one range of the (tenant, status, activity) index, so the work is bounded by
    the caps, not by the tenant: exact counts, like OFFSET paging, grew with it (the list page
    took 5-8 s at 400,000 sagas)."""
    lapsed = _lapsed(now)
    running = sagas.filter(status=SagaStatus.RUNNING)
    counts = {}
    for status in statuses:
        if status == SagaStatus.RUNNING:
            counts[status] = _bounded(running, _and(~lapsed, hit), cap)
        elif status == SagaStatus.ORPHANED:
            # Both ways of being orphaned (stored, or running with a lapsed lease): two ranges.
            stored = _bounded(sagas.filter(status=SagaStatus.ORPHANED), hit, cap)
            counts[status] = (stored + _bounded(running, _and(lapsed, hit), cap)).capped(cap)
        else:
            counts[status] = _bounded(sagas.filter(status=status), hit, cap)
    return counts


def uses_tool(tool: str) -> Exists:
    """Whether a saga has a step using `tool` (a probe of its steps, for a filter)."""
    return Exists(Step.objects.filter(saga=OuterRef("pk"), tool=tool))


def _and(q: Q, hit: Q | Exists | None) -> Q:
    return q if hit is None else q & Q(hit)


def _bounded(sagas: QuerySet[Saga], hit: Q | Exists | None, cap: int) -> BoundedCount:
    if hit is None:
        n = newest_first(sagas).values("pk")[: cap + 1].count()
        return BoundedCount(n).capped(cap)
    walk = newest_first(sagas).annotate(hit=ExpressionWrapper(hit, output_field=BooleanField()))
    sql, params = walk.values("hit")[:COUNT_WALK].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), COUNT(CASE WHEN w.hit THEN 1 END) FROM ({sql}) w", params)
        walked, hits = cursor.fetchone()
    return BoundedCount(hits, more=walked >= COUNT_WALK).capped(cap)


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
    return sagas.filter(uses_tool(tool))


# The list's tool filter, page by page (`newest_page`): walk at most WALK sagas newest first,
# probing each one's steps; a tool too rare to fill a page within them is answered from the
# (tenant, tool, saga) index instead, when it names at most IDS_CAP sagas.
WALK = 5_000
IDS_CAP = 20_000


def newest_page(
    sagas: QuerySet[Saga],
    *,
    tool: str,
    position: tuple[datetime | None, int] | None,
    limit: int,
    newer: bool = False,
) -> list[Saga]:
    """The first `limit` sagas of `sagas` in `newest_first` order after `position` (a keyset, or
    None for the first page), with a step using `tool` when one is given. With `newer`, the
    `limit` sagas just before `position` instead (the page before it, for a "Newer" link), still
    newest first: read oldest first from the position, the same bounded way, and turned round.

    By tool, Postgres' planner has two ways, and which is cheaper turns on how rare the tool is:
    walking the sagas newest first and probing each one's steps (a common tool: the page fills
    within a few hundred sagas), or reading the tool's sagas from the step index and sorting them
    (a rare one). It chooses by its estimates, and at 10M records it chose the walk for a tool one
    saga in a thousand used: 136,000 probes, 0.5 s. So the choice is made here, by trying: a walk
    bounded to WALK sagas first (cheap when it fills the page: 4 ms for the whole walk at 10M
    records), then the index (17 ms for a tool 1,670 sagas of 1.67M used)."""
    if not newer:
        return _first_by_tool(
            after(sagas, *position) if position is not None else sagas, tool, limit, newest_first
        )
    if position is None:
        raise ValueError("a newer page is the page before a position")
    found: list[Saga] = []
    for part in before(sagas, *position):
        found += _first_by_tool(part, tool, limit - len(found), oldest_first)
        if len(found) >= limit:
            break
    return found[::-1]


def _first_by_tool(
    sagas: QuerySet[Saga], tool: str, limit: int, order: Callable[[QuerySet[Saga]], QuerySet[Saga]]
) -> list[Saga]:
    """The first `limit` sagas of `sagas` in `order` with a step using `tool` (any when "")."""
    if not tool:
        return list(order(sagas)[:limit])
    uses = uses_tool(tool)
    walk = order(sagas.annotate(uses_tool=uses))[:WALK]
    sql, params = walk.query.sql_with_params()
    # A filter over the ordered, limited walk keeps its order and stops at `limit` hits: at most
    # WALK probes, usually `limit` and a few.
    found = list(
        Saga.objects.raw(f"SELECT * FROM ({sql}) walk WHERE walk.uses_tool LIMIT %s", [*params, limit])
    )
    if len(found) == limit:
        return found
    ids = Step.objects.filter(tool=tool).order_by().values_list("saga_id", flat=True).distinct()
    return list(order(queries.with_step_in(sagas, ids, uses, cap=IDS_CAP))[:limit])


def newest_first(sagas: QuerySet[Saga]) -> QuerySet[Saga]:
    """Most recently active first (sagas with no activity time before all others on every
    database), ties newest id first: the order of the indexes ending in (last_activity_at, id)."""
    return sagas.order_by(F("last_activity_at").desc(nulls_first=True), "-pk")


def oldest_first(sagas: QuerySet[Saga]) -> QuerySet[Saga]:
    """`newest_first` turned round (the same indexes, read the other way)."""
    return sagas.order_by(F("last_activity_at").asc(nulls_last=True), "pk")


def after(sagas: QuerySet[Saga], last_activity_at: datetime | None, pk: int) -> QuerySet[Saga]:
    """The sagas of `sagas` that come after (last_activity_at, pk) in `newest_first` order: the
    keyset of the next page. The redundant upper bound lets the database start the index range
    there instead of filtering from the newest saga."""
    if last_activity_at is None:
        return sagas.filter(Q(last_activity_at=None, pk__lt=pk) | Q(last_activity_at__isnull=False))
    return sagas.filter(last_activity_at__lte=last_activity_at).filter(
        Q(last_activity_at__lt=last_activity_at) | Q(last_activity_at=last_activity_at, pk__lt=pk)
    )


def before(sagas: QuerySet[Saga], last_activity_at: datetime | None, pk: int) -> list[QuerySet[Saga]]:
    """The sagas of `sagas` that come before (last_activity_at, pk) in `newest_first` order, as
    parts to read in `oldest_first` order one after the other: the activity-time range from the
    position up, then the sagas with no activity time (first in `newest_first`). One query with
    an OR across the two would not be one index range, and the database would read the tenant's
    sagas from the oldest up to the position."""
    if last_activity_at is None:
        return [sagas.filter(last_activity_at=None, pk__gt=pk)]
    ranged = sagas.filter(last_activity_at__gte=last_activity_at).filter(
        Q(last_activity_at__gt=last_activity_at) | Q(last_activity_at=last_activity_at, pk__gt=pk)
    )
    return [ranged, sagas.filter(last_activity_at=None)]


class BadCursor(ValueError):
    """A cursor `cursor_of` did not write."""


def cursor_of(saga: Saga) -> str:
    """The keyset of `saga` in `newest_first` order, as an opaque URL-safe string (the API's
    `next` links and the list page's Newer / Older links)."""
    moment = saga.last_activity_at.isoformat() if saga.last_activity_at is not None else "-"
    return base64.urlsafe_b64encode(f"{moment}|{saga.pk}".encode()).decode().rstrip("=")


_BIGINT = 2**63 - 1


def cursor_position(cursor: str) -> tuple[datetime | None, int]:
    """(last activity, id) of the saga a cursor was made from; anything else raises BadCursor."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, _, pk_text = text.rpartition("|")
        pk = ascii_int(pk_text, max_digits=19)  # `cursor_of` writes ASCII digits
        if pk is None:
            raise BadCursor(cursor)
        when = None if moment == "-" else datetime.fromisoformat(moment)
        if when is not None and when.tzinfo is not None:
            when = when.astimezone(UTC)  # a moment past year 1 or 9999 in UTC overflows here, not in SQLite
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise BadCursor(cursor) from None
    if not 0 < pk <= _BIGINT or (when is not None and when.tzinfo is None):
        raise BadCursor(cursor)
    return when, pk


def step_counts(sagas: list[Saga]) -> dict[int, int]:
    """Saga pk -> how many steps it has, for a page of sagas (one query, bounded by the page)."""
    rows = Step.objects.filter(saga_id__in=[s.pk for s in sagas]).order_by().values("saga_id")
    return {row["saga_id"]: row["n"] for row in rows.annotate(n=Count("pk"))}


def step_tools(limit: int = 200) -> list[str]:
    """Tool names any step used, sorted (for a filter's choices): a skip scan of the (tenant, tool,
    saga) index, one probe per distinct tool, where a DISTINCT reads every step of the tenant
    (0.5 s at 1.6M steps). Both databases run the recursive query."""
    table = connection.ops.quote_name(Step._meta.db_table)
    tenant = current_tenant().pk
    sql = f"""
        WITH RECURSIVE tools(tool, n) AS (
            SELECT (SELECT tool FROM {table} WHERE tenant_id = %s AND tool > '' ORDER BY tool LIMIT 1), 1
            UNION ALL
            SELECT (SELECT s.tool FROM {table} s WHERE s.tenant_id = %s AND s.tool > tools.tool
                    ORDER BY s.tool LIMIT 1), tools.n + 1
            FROM tools WHERE tools.tool IS NOT NULL AND tools.n < %s
        )
        SELECT tool FROM tools WHERE tool IS NOT NULL ORDER BY n"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant, tenant, limit])
        return [row[0] for row in cursor.fetchall()]


def recent_stream_agents(sample: int = 2_000) -> list[tuple[str, str]]:
    """(stream id, agent name) pairs named by the `sample` most recently active sagas: the names
    beside the stream ids of the filter, from one index range (a DISTINCT over every saga grew
    with the tenant: 0.2 s at 400,000 sagas)."""
    # The agent test is made here: in the query, a tenant whose agents give no name would have
    # the database walk every saga looking for one.
    recent = newest_first(Saga.objects.all()).values_list("stream_id", "agent")[:sample]
    return sorted({(stream_id, agent) for stream_id, agent in recent if agent})


@dataclass(frozen=True, slots=True)
class StartedSaga:
    """A saga as the Fleet page's chart draws it, with its effective status at the query's `now`."""

    saga_id: str
    name: str
    stream_id: str
    agent: str
    status: str
    started_at: datetime | None
    last_activity_at: datetime | None


def started_sagas_active_since(since: datetime, limit: int, now: datetime) -> list[StartedSaga]:
    """Sagas with a start, active since `since`, in order of start (at most `limit`): only what
    the chart draws, its effective status decided in the query (thousands of rows: no models)."""
    effective = Case(
        When(_lapsed(now), then=Value(SagaStatus.ORPHANED)), default=F("status"), output_field=CharField()
    )
    rows = (
        Saga.objects.filter(last_activity_at__gte=since)
        .exclude(started_at=None)
        .order_by("started_at")
        .annotate(effective=effective)
        .values_list("saga_id", "name", "stream_id", "agent", "effective", "started_at", "last_activity_at")
    )
    return [StartedSaga(*row) for row in rows[:limit]]


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
