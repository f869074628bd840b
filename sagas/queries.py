"""The saga projection's SQL written for one database, all of it (issue 25): each query answers the
same on every database (tests/sagas/test_queries.py runs each on Postgres and on SQLite);
elsewhere the projection speaks the ORM.

- `load` and `save`: reading and writing the folded projection, one statement per batch on
  Postgres, the ORM elsewhere. `sagas.services.apply_records` decides every value (in Python,
  from the records, under the tenant log lock); `save` only persists the sagas and steps a batch
  touched. On Postgres that is a single upsert: sagas `INSERT ... ON CONFLICT (tenant, saga_id) DO
  UPDATE`, then their touched steps `INSERT ... ON CONFLICT (saga, step_id) DO UPDATE`, in one
  round trip, inside the ingest transaction and under the tenant's row-level security; guarded
  (`guarded_save`) by what a fold made before the tenant log lock read.
- `with_step_in`: the sagas among a query whose id a list of saga ids holds, as one array
  parameter on Postgres.

The tenant is each query's argument, never left to the active scope alone: these run inside the
caller's tenant transaction, and on SQLite nothing else would filter them.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, QuerySet

from core.sql import is_postgres, server_cursor
from sagas.models import Saga, SagaStatus, Step, StepStatus

SAGA_FIELDS = [
    "name",
    "agent",
    "status",
    "started_at",
    "last_activity_at",
    "last_lease_at",
    "lease_ttl",
    "lease_expires_at",
    "last_event",
    "record_count",
    "first_leaf_index",
    "last_leaf_index",
]
STEP_FIELDS = ["tool", "semantics", "status", "compensation", "last_leaf_index"]


class SagaState:
    """A saga's projected columns while a batch is folded in (cheaper than a model instance)."""

    __slots__ = ("pk", "tenant_id", "saga_id", "stream_id", *SAGA_FIELDS)

    def __init__(self, tenant_id: int, saga_id: str, stream_id: str, pk: int | None = None) -> None:
        self.pk = pk
        self.tenant_id = tenant_id
        self.saga_id = saga_id
        self.stream_id = stream_id
        self.name = ""
        self.agent = ""
        self.status: str = SagaStatus.RUNNING
        self.started_at: datetime | None = None
        self.last_activity_at: datetime | None = None
        self.last_lease_at: datetime | None = None
        self.lease_ttl: float | None = None
        self.lease_expires_at: datetime | None = None
        self.last_event = ""
        self.record_count = 0
        self.first_leaf_index: int | None = None
        self.last_leaf_index: int | None = None


class StepState:
    """A step's projected columns while a batch is folded in."""

    __slots__ = ("pk", "saga", "step_id", "ordinal", "first_leaf_index", *STEP_FIELDS)

    def __init__(
        self,
        saga: SagaState,
        step_id: str,
        ordinal: int,
        first_leaf_index: int,
        last_leaf_index: int,
        pk: int | None = None,
    ) -> None:
        self.pk = pk
        self.saga = saga
        self.step_id = step_id
        self.ordinal = ordinal
        self.first_leaf_index = first_leaf_index
        self.last_leaf_index = last_leaf_index
        self.tool = ""
        self.semantics = ""
        self.status: str = StepStatus.INTENT
        self.compensation: Any = None


def load(
    tenant_id: int, saga_ids: Sequence[str], *, steps_of: Collection[str] | None = None
) -> tuple[dict[str, SagaState], dict[str, dict[str, StepState]]]:
    """The current projection of `saga_ids` (the active tenant's; call under the tenant log lock),
    and their steps by saga in ordinal order: of every saga, or (`steps_of`) of those sagas only,
    the others' left empty (a fold whose records touch no step of a saga needs none of them:
    the integrator's seals, a saga's start and end)."""
    sagas: dict[str, SagaState] = {}
    by_pk: dict[int, SagaState] = {}
    steps: dict[str, dict[str, StepState]] = {sid: {} for sid in saga_ids}
    for row in _select_sagas(tenant_id, saga_ids):
        saga = SagaState(tenant_id, row[1], row[2], pk=row[0])
        for name, value in zip(SAGA_FIELDS, row[3:], strict=True):
            setattr(saga, name, value)
        sagas[saga.saga_id] = saga
        by_pk[row[0]] = saga
    if by_pk:
        # Asked even when no saga's steps are wanted: one statement per fold, whatever the records.
        wanted = [pk for pk, saga in by_pk.items() if steps_of is None or saga.saga_id in steps_of]
        for row in _select_steps(tenant_id, wanted):
            saga = by_pk[row[1]]
            step = StepState(saga, row[2], row[3], row[4], row[-1], pk=row[0])
            for name, value in zip(STEP_FIELDS, row[5:], strict=True):
                setattr(step, name, value)
            steps[saga.saga_id][step.step_id] = step
    return sagas, steps


# Leaf indices folded before the tenant log was locked are markers -(n+1) for the batch's n-th
# record; `leaf()` turns them into base + n. The guard: the sagas as read before the lock are what is
# stored now (same row, same last leaf), else nothing is written and the caller folds again.
_LEAF = "CASE WHEN {0} < 0 THEN %(base)s - {0} - 1 ELSE {0} END"
_UPSERT = """
WITH cur AS (
    SELECT id, saga_id, last_leaf_index FROM sagas_saga
    WHERE tenant_id = %(tenant)s AND saga_id = ANY(%(saga_id)b::text[])
), ok AS (
    SELECT NOT %(guard)s OR NOT EXISTS (
        SELECT 1 FROM cur
        FULL JOIN unnest(%(known_saga)b::text[], %(known_pk)b::bigint[], %(known_last)b::bigint[])
            AS k(saga_id, pk, last) USING (saga_id)
        WHERE cur.id IS DISTINCT FROM k.pk OR cur.last_leaf_index IS DISTINCT FROM k.last
    ) AS ok
), s AS (
    INSERT INTO sagas_saga (
        tenant_id, saga_id, stream_id, name, agent, status, started_at, last_activity_at,
        last_lease_at, lease_ttl, lease_expires_at, last_event, record_count, first_leaf_index,
        last_leaf_index
    )
    SELECT %(tenant)s, u.saga_id, u.stream_id, u.name, u.agent, u.status, u.started_at,
        u.last_activity_at, u.last_lease_at, u.lease_ttl, u.lease_expires_at, u.last_event, u.record_count,
        LEAF(u.first_leaf_index), LEAF(u.last_leaf_index)
    FROM unnest(
        %(saga_id)b::text[], %(stream_id)b::text[], %(name)b::text[], %(agent)b::text[],
        %(status)b::text[], %(started_at)b::timestamptz[], %(last_activity_at)b::timestamptz[],
        %(last_lease_at)b::timestamptz[], %(lease_ttl)b::float8[], %(lease_expires_at)b::timestamptz[],
        %(last_event)b::text[], %(record_count)b::int[], %(first_leaf_index)b::bigint[],
        %(last_leaf_index)b::bigint[]
    ) AS u(saga_id, stream_id, name, agent, status, started_at, last_activity_at, last_lease_at,
           lease_ttl, lease_expires_at, last_event, record_count, first_leaf_index, last_leaf_index)
    WHERE (SELECT ok FROM ok)
    ON CONFLICT (tenant_id, saga_id) DO UPDATE SET
        name = EXCLUDED.name,
        agent = EXCLUDED.agent,
        status = EXCLUDED.status,
        started_at = EXCLUDED.started_at,
        last_activity_at = EXCLUDED.last_activity_at,
        last_lease_at = EXCLUDED.last_lease_at,
        lease_ttl = EXCLUDED.lease_ttl,
        lease_expires_at = EXCLUDED.lease_expires_at,
        last_event = EXCLUDED.last_event,
        record_count = EXCLUDED.record_count,
        first_leaf_index = EXCLUDED.first_leaf_index,
        last_leaf_index = EXCLUDED.last_leaf_index
    RETURNING id, saga_id
), t AS (
    INSERT INTO sagas_step (
        tenant_id, saga_id, step_id, ordinal, tool, semantics, status, compensation,
        first_leaf_index, last_leaf_index
    )
    SELECT %(tenant)s, s.id, v.step_id, v.ordinal, v.tool, v.semantics, v.status, v.compensation::jsonb,
        LEAF(v.first_leaf_index), LEAF(v.last_leaf_index)
    FROM unnest(
        %(st_saga)b::text[], %(st_step)b::text[], %(st_ordinal)b::int[], %(st_tool)b::text[],
        %(st_semantics)b::text[], %(st_status)b::text[], %(st_compensation)b::text[],
        %(st_first)b::bigint[], %(st_last)b::bigint[]
    ) AS v(saga_key, step_id, ordinal, tool, semantics, status, compensation, first_leaf_index,
           last_leaf_index)
    JOIN s ON s.saga_id = v.saga_key
    ON CONFLICT (saga_id, step_id) DO UPDATE SET
        tool = EXCLUDED.tool,
        semantics = EXCLUDED.semantics,
        status = EXCLUDED.status,
        compensation = EXCLUDED.compensation,
        last_leaf_index = EXCLUDED.last_leaf_index
)
SELECT (SELECT ok FROM ok), s.id, s.saga_id FROM (SELECT 1) AS one LEFT JOIN s ON true
"""
for _column in ("u.first_leaf_index", "u.last_leaf_index", "v.first_leaf_index", "v.last_leaf_index"):
    _UPSERT = _UPSERT.replace(f"LEAF({_column})", _LEAF.format(_column))


_SAGA_COLUMNS = ["id", "saga_id", "stream_id", *SAGA_FIELDS]
_STEP_COLUMNS = ["id", "saga_id", "step_id", "ordinal", "first_leaf_index", *STEP_FIELDS]


def _select_sagas(tenant_id: int, saga_ids: Sequence[str]) -> list[tuple[Any, ...]]:
    if not is_postgres():
        found = Saga.objects.filter(tenant_id=tenant_id, saga_id__in=list(saga_ids))
        return list(found.values_list(*_SAGA_COLUMNS))
    # One array parameter instead of an IN list of hundreds (the ORM builds those slowly); the
    # tenant condition uses the (tenant, saga_id) unique index, and RLS applies as well.
    with server_cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(_SAGA_COLUMNS)} FROM sagas_saga "
            "WHERE tenant_id = %(tenant)s AND saga_id = ANY(%(ids)b::text[])",
            {"tenant": tenant_id, "ids": list(saga_ids)},
        )
        return cursor.fetchall()


def _select_steps(tenant_id: int, saga_pks: list[int]) -> list[tuple[Any, ...]]:
    if not is_postgres():
        return list(
            Step.objects.filter(tenant_id=tenant_id, saga_id__in=saga_pks)
            .order_by("saga_id", "ordinal")
            .values_list(*_STEP_COLUMNS)
        )
    # jsonb read as text and decoded here, whatever loaders the connection has registered.
    columns = ["compensation::text" if c == "compensation" else c for c in _STEP_COLUMNS]
    at = _STEP_COLUMNS.index("compensation")
    with server_cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(columns)} FROM sagas_step "
            "WHERE tenant_id = %(tenant)s AND saga_id = ANY(%(pks)b::bigint[]) ORDER BY saga_id, ordinal",
            {"tenant": tenant_id, "pks": saga_pks},
        )
        rows = cursor.fetchall()
    return [(*r[:at], None if r[at] is None else json.loads(r[at]), *r[at + 1 :]) for r in rows]


def guarded_save() -> bool:
    """Whether `save` takes a `snapshot`: writes a fold made before the tenant log lock only if the
    sagas it read are unchanged (Postgres, one guarded statement). Elsewhere folds are made under
    the lock, and nothing is folded early."""
    return is_postgres()


def save(
    tenant_id: int,
    new_sagas: Sequence[SagaState],
    existing: Sequence[SagaState],
    steps: Sequence[StepState],
    *,
    base: int = 0,
    snapshot: dict[str, tuple[int | None, int | None]] | None = None,
) -> bool:
    """Persist the sagas a batch touched (new and existing) and the steps it touched (new or
    changed; each step's `saga` is one of those sagas). With `snapshot` (Postgres, folded before the
    tenant log lock): write only if the stored sagas are still those the fold started from, and
    answer whether it wrote; leaf markers -(n+1) become base + n."""
    if is_postgres():
        return _save_postgres(tenant_id, [*new_sagas, *existing], steps, base, snapshot)
    if snapshot is not None:  # pragma: no cover - callers fold early on Postgres only (guarded_save)
        raise ValueError("a guarded save is for Postgres")
    _save_orm(tenant_id, new_sagas, existing, steps)
    return True


def _saga_model(tenant_id: int, state: SagaState) -> Saga:
    saga = Saga(tenant_id=tenant_id, saga_id=state.saga_id, stream_id=state.stream_id, pk=state.pk)
    for name in SAGA_FIELDS:
        setattr(saga, name, getattr(state, name))
    return saga


def _save_orm(
    tenant_id: int, new_sagas: Sequence[SagaState], existing: Sequence[SagaState], steps: Sequence[StepState]
) -> None:
    created = [_saga_model(tenant_id, s) for s in new_sagas]
    Saga.objects.bulk_create(created)
    for saga_state, model in zip(new_sagas, created, strict=True):
        saga_state.pk = model.pk
    if existing:
        Saga.objects.bulk_update([_saga_model(tenant_id, s) for s in existing], SAGA_FIELDS)
    models = []
    for step_state in steps:
        # Every saga a step names was either loaded or created just above, so it has its pk.
        assert step_state.saga.pk is not None
        step = Step(
            tenant_id=tenant_id,
            saga_id=step_state.saga.pk,
            pk=step_state.pk,
            step_id=step_state.step_id,
            ordinal=step_state.ordinal,
            first_leaf_index=step_state.first_leaf_index,
        )
        for name in STEP_FIELDS:
            setattr(step, name, getattr(step_state, name))
        models.append(step)
    # Split before inserting: bulk_create sets the new steps' pks, which would make them look dirty.
    dirty = [m for m in models if m.pk is not None]
    Step.objects.bulk_create([m for m in models if m.pk is None])
    if dirty:
        Step.objects.bulk_update(dirty, STEP_FIELDS)


def _save_postgres(
    tenant_id: int,
    sagas: Sequence[SagaState],
    steps: Sequence[StepState],
    base: int,
    snapshot: dict[str, tuple[int | None, int | None]] | None,
) -> bool:
    if not sagas:
        return True
    known = snapshot or {}
    params = {
        "tenant": tenant_id,
        "base": base,
        "guard": snapshot is not None,
        "known_saga": list(known),
        "known_pk": [pk for pk, _ in known.values()],
        "known_last": [last for _, last in known.values()],
        "saga_id": [s.saga_id for s in sagas],
        "stream_id": [s.stream_id for s in sagas],
        "name": [s.name for s in sagas],
        "agent": [s.agent for s in sagas],
        "status": [str(s.status) for s in sagas],
        "started_at": [s.started_at for s in sagas],
        "last_activity_at": [s.last_activity_at for s in sagas],
        "last_lease_at": [s.last_lease_at for s in sagas],
        "lease_ttl": [s.lease_ttl for s in sagas],
        "lease_expires_at": [s.lease_expires_at for s in sagas],
        "last_event": [s.last_event for s in sagas],
        "record_count": [s.record_count for s in sagas],
        "first_leaf_index": [s.first_leaf_index for s in sagas],
        "last_leaf_index": [s.last_leaf_index for s in sagas],
        "st_saga": [s.saga.saga_id for s in steps],
        "st_step": [s.step_id for s in steps],
        "st_ordinal": [s.ordinal for s in steps],
        "st_tool": [s.tool for s in steps],
        "st_semantics": [s.semantics for s in steps],
        "st_status": [str(s.status) for s in steps],
        "st_compensation": [None if s.compensation is None else json.dumps(s.compensation) for s in steps],
        "st_first": [s.first_leaf_index for s in steps],
        "st_last": [s.last_leaf_index for s in steps],
    }
    with server_cursor() as cursor:
        cursor.execute(_UPSERT, params)
        result = cursor.fetchall()
    if not result[0][0]:
        return False
    ids = {saga_id: pk for _, pk, saga_id in result if pk is not None}
    for saga in sagas:
        saga.pk = ids[saga.saga_id]
    return True


def with_step_in(
    sagas: QuerySet[Saga], saga_pks: QuerySet[Step, int], uses: Exists, *, cap: int
) -> QuerySet[Saga]:
    """The sagas among `sagas` whose id `saga_pks` (the tenant's steps' saga ids) lists, unordered.
    Postgres: when the list has at most `cap` ids, read them first and pass them as one array
    parameter, so the plan is primary-key lookups and a top-N sort (an IN list of thousands of
    parameters costs more to plan than to run: 22-120 ms against 17 at 10M records); past `cap`,
    `uses` (the same steps, as a probe of each saga) and the planner decides. Elsewhere a subquery.
    `sagas` and `saga_pks` are the active tenant's (TenantScopedModel)."""
    if not is_postgres():
        return sagas.filter(pk__in=saga_pks)
    listed = list(saga_pks[: cap + 1])
    if len(listed) > cap:  # common overall, yet not among the newest walked: the planner decides
        return sagas.filter(uses)
    table = connection.ops.quote_name(Saga._meta.db_table)
    return sagas.extra(where=[f"{table}.id = ANY(%s)"], params=[listed])
