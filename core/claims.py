"""Leased work claimed with a fencing token, one way for every app (healthchecks' style: the row
is the truth, no broker or lock service decides who holds what).

A row of leased work (a recovery job, a reconciliation check, the posting of a Slack channel
message, the settlement of an expired budget lease, the build of a WORM export) has a state, an
integer fencing token, a holder and the end of its lease. A claim is one statement, a conditional UPDATE:

    WITH picked (pk, token) AS (<the caller's candidates, ordered and limited,
                                 locked FOR UPDATE SKIP LOCKED where rows can be locked>)
    UPDATE <table> SET <state> = <claimed>, <token> = <token> + 1, <holder> = ..., <lease> = ...
    FROM picked WHERE <pk> = picked.pk AND <token> = picked.token AND <state> IN (<claimable>)
    RETURNING <every column>

The candidates are an ordinary queryset of the app (readiness written once, in the ORM, with
the tenant filter its manager adds): Django compiles it for the database at hand, so the same
claim runs on Postgres (rows locked, two claimers never wait on each other) and on SQLite (no
row locks: a claimer that raced this one raised the token first, and the UPDATE's guard makes
this one take nothing of those rows). Claims compile their candidates once per `shape` (below),
since building and compiling the ORM query cost more than running it on the hot path.

The holder proves its right with the token the claim returned: `Leased.holds(row, token)` is
true only while the row is claimed with that token, so a holder whose lease lapsed and whose
row was claimed again (a new token) records nothing.

Adopting it: describe the model's columns once,

    DELIVERIES = Leased(Delivery, state="state", claimed=State.SENDING,
                        claimable=(State.QUEUED, State.SENDING), token="epoch",
                        holder="worker", lease="lease_expires_at")

then claim with the candidates as a function of the moment, ordered, not sliced (the claim
adds its `limit`); `now` is the only value that may change between two claims of one `shape`,
and is used as a datetime value of the filters (its positions are found by a sentinel moment),

    rows = claim(DELIVERIES, lambda now: Delivery.objects.filter(due_at__lte=now).order_by("due_at"),
                 now=timezone.now(), holder=name, lease_until=now + LEASE, limit=10,
                 shape=("deliveries", tenant.pk))

and check a result's token with `DELIVERIES.holds(row, token)` on the row locked for update, or
write as the holder with `DELIVERIES.held(queryset, token).update(...)` (a conditional UPDATE).
`also` sets more columns in the same UPDATE: a value, `Increment()` (+1) or `SetIfNull(value)`.
The returned rows come in the candidates' order (plain fields of the model only).
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from django.core.exceptions import EmptyResultSet
from django.db import connections, models, router

M = TypeVar("M", bound=models.Model)

# A moment no real claim uses: compiled in place of `now` so its parameters can be found again.
_SENTINEL = datetime(1970, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
_CACHE_SIZE = 512


@dataclass(frozen=True)
class Increment:
    """`also` value: the column is raised by one (a claim counting its attempts)."""


@dataclass(frozen=True)
class SetIfNull:
    """`also` value: the column is set only where it is still NULL (the first claim's moment)."""

    value: Any


@dataclass(frozen=True)
class Leased(Generic[M]):
    """Which columns of `model` carry the lease: the state column, the state a claim leaves the
    row in, the states a claim may take it from, the fencing token, the holder (None: the row
    names none) and the lease's end (field names). A row whose lease is a sign of life instead
    (an export's heartbeat: stale a window later) gets the claim's moment as `lease_until`."""

    model: type[M]
    state: str
    claimed: str
    claimable: tuple[str, ...]
    token: str
    holder: str | None
    lease: str
    holder_max: int = 200
    _statements: OrderedDict[Hashable, _Compiled | None] = field(
        default_factory=OrderedDict, compare=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def holds(self, row: M, token: object) -> bool:
        """Whether `token` is the row's current fencing token and the row is still claimed."""
        return getattr(row, self.state) == self.claimed and getattr(row, self.token) == token

    def held(self, rows: models.QuerySet[M], token: object) -> models.QuerySet[M]:
        """`rows` while still claimed with `token`: a holder's conditional write (`.update(...)`)
        through this changes nothing once its lease lapsed and the row was claimed again."""
        return rows.filter(**{self.state: self.claimed, self.token: token})


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: list[Any]
    now_at: tuple[int, ...]  # positions of `now` among the candidates' parameters
    order: tuple[str, ...]


def claim(
    leased: Leased[M],
    candidates: Callable[[datetime], models.QuerySet[M]],
    *,
    now: datetime,
    holder: str,
    lease_until: datetime,
    limit: int,
    shape: Hashable,
    also: Mapping[str, Any] | None = None,
) -> list[M]:
    """Claim up to `limit` of the rows `candidates(now)` picks, in one conditional UPDATE that
    raises each one's token; the rows taken, in the candidates' order. `shape` names every input
    of `candidates` except `now` (the tenant, the filters' values): one compiled statement is kept
    per shape, so two calls with one shape must build the same query but for `now`."""
    if limit < 1:
        return []
    connection = connections[router.db_for_write(leased.model)]
    compiled = _compiled(leased, candidates, shape, connection.alias)
    if compiled is None:
        return []
    params = list(compiled.params)
    moment = _adapt(leased.model, leased.lease, now, connection)
    for position in compiled.now_at:
        params[position] = moment
    sql, update_params = _update(leased, compiled.sql, holder, lease_until, also or {}, connection)
    taken = list(leased.model._default_manager.raw(sql, [*params, limit, *update_params]))
    return _ordered(taken, compiled.order)


def _compiled(
    leased: Leased[M], candidates: Callable[[datetime], models.QuerySet[M]], shape: Hashable, alias: str
) -> _Compiled | None:
    """The candidates' statement for this shape (None: they can match nothing), compiled once."""
    key = (alias, shape)
    with leased._lock:
        if key in leased._statements:
            leased._statements.move_to_end(key)
            return leased._statements[key]
    queryset = candidates(_SENTINEL)
    order = tuple(str(name) for name in queryset.query.order_by)
    picked = queryset.select_for_update(skip_locked=True, of=("self",)).values_list("pk", leased.token)
    found: _Compiled | None
    try:
        sql, params = picked.query.get_compiler(using=alias).as_sql()
    except EmptyResultSet:  # e.g. `handler__in=[]`
        found = None
    else:
        sentinel = _adapt(leased.model, leased.lease, _SENTINEL, connections[alias])
        now_at = tuple(i for i, value in enumerate(params) if value == sentinel)
        found = _Compiled(_limited(sql, connections[alias].vendor), list(params), now_at, order)
    with leased._lock:
        leased._statements[key] = found
        while len(leased._statements) > _CACHE_SIZE:
            leased._statements.popitem(last=False)
    return found


def _limited(sql: str, vendor: str) -> str:
    """The candidates with the claim's limit as a parameter (their SQL has no LIMIT yet), placed
    where the database wants it: before Postgres' locking clause."""
    lock = sql.rfind(" FOR UPDATE")
    if vendor == "postgresql" and lock != -1:
        return f"{sql[:lock]} LIMIT %s{sql[lock:]}"
    return f"{sql} LIMIT %s"


def _update(
    leased: Leased[M],
    picked_sql: str,
    holder: str,
    lease_until: datetime,
    also: Mapping[str, Any],
    connection: Any,
) -> tuple[str, list[Any]]:
    meta = leased.model._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)

    def column(name: str) -> str:
        found = meta.get_field(name)
        assert isinstance(found, models.Field), name  # a concrete column, not a relation's reverse
        return quote(str(found.column))

    sets = [f"{column(leased.state)} = %s", f"{column(leased.token)} = {table}.{column(leased.token)} + 1"]
    params: list[Any] = [leased.claimed]
    if leased.holder is not None:
        sets.append(f"{column(leased.holder)} = %s")
        params.append(holder[: leased.holder_max])
    sets.append(f"{column(leased.lease)} = %s")
    params.append(_adapt(leased.model, leased.lease, lease_until, connection))
    for name, value in also.items():
        if isinstance(value, Increment):
            sets.append(f"{column(name)} = {table}.{column(name)} + 1")
        elif isinstance(value, SetIfNull):
            sets.append(f"{column(name)} = COALESCE({table}.{column(name)}, %s)")
            params.append(_adapt(leased.model, name, value.value, connection))
        else:
            sets.append(f"{column(name)} = %s")
            params.append(_adapt(leased.model, name, value, connection))
    states = ", ".join(["%s"] * len(leased.claimable))
    params += [*leased.claimable]
    pk = column(meta.pk.name)
    returning = ", ".join(f"{table}.{quote(str(f.column))}" for f in meta.concrete_fields)
    sql = (
        f"WITH picked (pick_pk, pick_token) AS ({picked_sql}) "
        f"UPDATE {table} SET {', '.join(sets)} FROM picked "
        f"WHERE {table}.{pk} = picked.pick_pk AND {table}.{column(leased.token)} = picked.pick_token "
        f"AND {table}.{column(leased.state)} IN ({states}) RETURNING {returning}"
    )
    return sql, params


def _adapt(model: type[models.Model], name: str, value: Any, connection: Any) -> Any:
    return model._meta.get_field(name).get_db_prep_save(value, connection)  # type: ignore[union-attr]


def _ordered(rows: list[M], order: Sequence[str]) -> list[M]:
    """`rows` in the candidates' order (RETURNING keeps none): sorted by each field of the
    ORDER BY, last first (stable sorts)."""
    for name in reversed(order):
        rows.sort(key=operator.attrgetter(name.lstrip("-")), reverse=name.startswith("-"))
    return rows
