"""The evidence store's SQL written for one database, all of it (issue 25): the set-based writes of
the ingest hot path. Each query answers the same on every database (tests/audit/test_queries.py
runs each on Postgres and on SQLite); elsewhere the store speaks the ORM.

On Postgres every batch is one statement per table family, with the values sent as typed arrays
and expanded by `unnest` on the server (server-side binding on the Django connection's own psycopg
connection, so the statement runs inside the caller's transaction and under the tenant's RLS
setting; the row-level-security WITH CHECK clause still applies to every row). On any other backend
(SQLite for the embedded demo and the fast test suite) the same rows go through `executemany`.

Nothing here decides anything: `audit.actions` verifies and plans, this module only writes what it
is given. The tenant is each query's argument (or its rows' column), never left to the active
scope: on SQLite nothing else would filter them. Queries go through Django's cursor wrapper, so
`CaptureQueriesContext` and the debug log see them like any ORM query.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Field, Model

from audit.models import Record, RecordPayload, Stream, TenantLog
from core import timing
from core.sql import is_postgres, server_cursor


def _column(model: type[Model], name: str) -> str:
    """The database column of one of `model`'s concrete fields."""
    field = model._meta.get_field(name)
    if not isinstance(field, Field) or field.column is None:
        raise LookupError(f"{model.__name__}.{name} is not a concrete field")
    return field.column


class StoredRow:
    """One appended record header, as the rest of the ingest needs it (the saga projection, the
    live event, the result). Cheaper than a model instance; `as_record()` makes one on demand."""

    __slots__ = (
        "pk",
        "tenant_id",
        "stream",
        "position",
        "seq",
        "ts",
        "ts_json",
        "event",
        "cd",
        "ph",
        "h",
        "saga_id",
        "step_id",
        "tool",
        "redacted",
        "received_at",
        "leaf_index",
        "leaf_hash",
        "fields_json",
        "salt",
        "verbatim",
    )

    def __init__(
        self,
        tenant_id: int,
        stream: Any,
        position: int,
        seq: int,
        ts: float,
        ts_json: str,
        event: str,
        cd: str,
        ph: str,
        h: str,
        saga_id: str,
        step_id: str,
        tool: str,
        redacted: str,
        leaf_hash: bytes,
        fields_json: str | None,
        salt: str | None,
        verbatim: str = "",
    ) -> None:
        self.pk: int | None = None
        self.tenant_id = tenant_id
        self.stream = stream
        self.position = position
        self.seq = seq
        self.ts = ts
        self.ts_json = ts_json
        self.event = event
        self.cd = cd
        self.ph = ph
        self.h = h
        self.saga_id = saga_id
        self.step_id = step_id
        self.tool = tool
        self.redacted = redacted
        self.received_at: datetime | None = None
        self.leaf_index = -1
        self.leaf_hash = leaf_hash
        self.fields_json = fields_json  # None: arrived as a redacted stub, no payload row
        self.salt = salt
        self.verbatim = verbatim  # see Record.verbatim

    def as_record(self) -> Record:
        if self.received_at is None:
            raise RuntimeError("as_record() is for a row that has been stored")
        record = Record(
            id=self.pk,
            tenant_id=self.tenant_id,
            stream=self.stream,
            position=self.position,
            seq=self.seq,
            ts=self.ts,
            ts_json=self.ts_json,
            event=self.event,
            cd=self.cd,
            ph=self.ph,
            h=self.h,
            saga_id=self.saga_id,
            step_id=self.step_id,
            tool=self.tool,
            redacted=self.redacted,
            verbatim=self.verbatim,
            received_at=self.received_at,
            leaf_index=self.leaf_index,
            leaf_hash=self.leaf_hash,
        )
        record._state.adding = False
        record._state.db = connection.alias
        return record


_ALLOCATE_AND_STORE_PAYLOADS = """
WITH ids AS (
    SELECT ord, nextval(%(seq)s::regclass) AS id FROM generate_series(1, %(n)s) AS ord
), p AS (
    INSERT INTO audit_recordpayload (tenant_id, record_id, fields_json, salt)
    SELECT %(tenant)s, ids.id, v.fields_json, v.salt
    FROM unnest(%(ord)b::int[], %(fields)b::text[], %(salt)b::text[]) AS v(ord, fields_json, salt)
    JOIN ids USING (ord)
)
SELECT id FROM ids ORDER BY ord
"""

_record_id_sequence: str | None = None


def _id_sequence(cursor: Any) -> str:
    global _record_id_sequence
    if _record_id_sequence is None:
        cursor.execute("SELECT pg_get_serial_sequence('audit_record', 'id')")
        _record_id_sequence = cursor.fetchone()[0]
    return _record_id_sequence


def prepare_records(rows: Sequence[StoredRow]) -> None:
    """Before the tenant log is locked: on Postgres, take the headers' ids from their sequence and
    write the payloads (their foreign key to the header is checked at commit, by which time the
    header exists or the whole transaction is rolled back). Keeps the locked section short."""
    if not rows or not is_postgres():
        return
    with_payload = [(n, r) for n, r in enumerate(rows, 1) if r.fields_json is not None]
    with server_cursor() as cursor:
        params = {
            "seq": _id_sequence(cursor),
            "n": len(rows),
            "tenant": rows[0].tenant_id,
            "ord": [n for n, _ in with_payload],
            "fields": [r.fields_json for _, r in with_payload],
            "salt": [r.salt for _, r in with_payload],
        }
        cursor.execute(_ALLOCATE_AND_STORE_PAYLOADS, params)
        ids = cursor.fetchall()
    for row, (pk,) in zip(rows, ids, strict=True):
        row.pk = pk


def append(tenant_id: int, stream: Stream, now: datetime, rows: Sequence[StoredRow]) -> int:
    """Under the tenant log lock (taken here, held until commit): the headers at leaf indices
    base.. in row order, their payloads (on Postgres already written by `prepare_records`), the
    tenant log's size and the stream head moved to the last row. Returns base, the first leaf
    index. On Postgres one statement (a second after the tenant's log row is created, for its
    first records); elsewhere the ORM's lock and updates around one `executemany` per table."""
    if is_postgres():
        base = _lock_and_append(tenant_id, stream, now, rows)
        if base is None:
            _lock_log(tenant_id)  # the tenant's first records: create its log row
            base = _lock_and_append(tenant_id, stream, now, rows)
        if base is None:  # pragma: no cover - the row was created and locked just above
            raise RuntimeError("the tenant's log row is missing")
        return base
    log = _lock_log(tenant_id)
    base = log.size
    for offset, row in enumerate(rows):
        row.leaf_index = base + offset
        row.received_at = now
    _insert_sqlite(rows)
    last = rows[-1]
    Stream.objects.filter(tenant_id=tenant_id, pk=stream.pk).update(
        head_hash=last.h, head_seq=last.seq, length=last.position, updated_at=now
    )
    stream.head_hash, stream.head_seq, stream.length = last.h, last.seq, last.position
    TenantLog.objects.filter(tenant_id=tenant_id, pk=log.pk).update(size=base + len(rows))
    return base


def _lock_log(tenant_id: int) -> TenantLog:
    """The tenant's log row, locked until the transaction ends (created on its first records)."""
    log = TenantLog.objects.select_for_update().filter(tenant_id=tenant_id).first()
    if log is None:
        TenantLog.objects.bulk_create([TenantLog(tenant_id=tenant_id)], ignore_conflicts=True)
        log = TenantLog.objects.select_for_update().get(tenant_id=tenant_id)
    return log


_LOCK_AND_APPEND = """
WITH log AS (
    UPDATE audit_tenantlog SET size = size + %(n)s
    WHERE tenant_id = %(tenant)s
    RETURNING size - %(n)s AS base
), h AS (
    INSERT INTO audit_record (
        tenant_id, stream_id, received_at, id, position, seq, ts, ts_json, event, cd, ph, h,
        saga_id, step_id, tool, redacted, verbatim, leaf_hash, leaf_index
    )
    SELECT %(tenant)s, %(stream)s, %(now)s, u.id, u.position, u.seq, u.ts, u.ts_json, u.event, u.cd,
        u.ph, u.h, u.saga_id, u.step_id, u.tool, u.redacted, u.verbatim, u.leaf_hash,
        log.base + u.ord - 1
    FROM log, unnest(
        %(id)b::bigint[], %(position)b::bigint[], %(seq)b::bigint[], %(ts)b::float8[],
        %(ts_json)b::text[], %(event)b::text[], %(cd)b::text[], %(ph)b::text[], %(h)b::text[],
        %(saga_id)b::text[], %(step_id)b::text[], %(tool)b::text[], %(redacted)b::text[],
        %(verbatim)b::text[], %(leaf_hash)b::bytea[]
    ) WITH ORDINALITY AS u(id, position, seq, ts, ts_json, event, cd, ph, h, saga_id, step_id, tool,
                           redacted, verbatim, leaf_hash, ord)
), s AS (
    UPDATE audit_stream
    SET head_hash = %(head_hash)s, head_seq = %(head_seq)s, length = %(length)s, updated_at = %(now)s
    WHERE tenant_id = %(tenant)s AND id = %(stream)s AND EXISTS (SELECT 1 FROM log)
)
SELECT base FROM log
"""


def wait_for_log(tenant_id: int) -> None:
    """Postgres: take the tenant log row lock (held until commit) in a statement of its own, so
    that waiting for it -- behind the other appends of the tenant, each holding it through its
    insert, projection write and commit -- is measured apart from the append (phase `log_lock`);
    `append` then takes the lock this transaction already holds. Elsewhere nothing: `append`
    takes the lock (SQLite's write transactions already run one at a time)."""
    if not is_postgres():
        return
    with timing.phase("log_lock"), server_cursor() as cursor:  # the tenant's appends serialise here
        cursor.execute("SELECT 1 FROM audit_tenantlog WHERE tenant_id = %s FOR UPDATE", [tenant_id])


def _lock_and_append(tenant_id: int, stream: Stream, now: datetime, rows: Sequence[StoredRow]) -> int | None:
    """Postgres, in one statement: take the tenant log row lock (UPDATE, held until commit) and
    advance its size, append the headers at leaf indices base.. in row order, and move the stream
    head to the last row. Returns base, or None when the tenant has no log row yet (nothing was
    written; create it and call again). `prepare_records` must have run (ids, payloads)."""
    last = rows[-1]
    params = {
        "tenant": tenant_id,
        "stream": stream.pk,
        "now": now,
        "n": len(rows),
        "head_hash": last.h,
        "head_seq": last.seq,
        "length": last.position,
        "id": [r.pk for r in rows],
        "position": [r.position for r in rows],
        "seq": [r.seq for r in rows],
        "ts": [r.ts for r in rows],
        "ts_json": [r.ts_json for r in rows],
        "event": [r.event for r in rows],
        "cd": [r.cd for r in rows],
        "ph": [r.ph for r in rows],
        "h": [r.h for r in rows],
        "saga_id": [r.saga_id for r in rows],
        "step_id": [r.step_id for r in rows],
        "tool": [r.tool for r in rows],
        "redacted": [r.redacted for r in rows],
        "verbatim": [r.verbatim for r in rows],
        "leaf_hash": [r.leaf_hash for r in rows],
    }
    with server_cursor() as cursor:
        cursor.execute(_LOCK_AND_APPEND, params)
        found = cursor.fetchone()
    if found is None:
        return None
    base = int(found[0])
    for offset, row in enumerate(rows):
        row.leaf_index = base + offset
        row.received_at = now
    stream.head_hash, stream.head_seq, stream.length = last.h, last.seq, last.position
    return base


def _insert_sqlite(rows: Sequence[StoredRow]) -> None:
    """SQLite: the headers then their payloads, each one `executemany` of a plain INSERT (no model
    instances; the ORM's bulk_create spent most of an embedded ingest building SQL). The ids are
    read back by (stream, position): the write transaction is IMMEDIATE, so nobody else inserts."""
    if not rows:
        return
    meta = Record._meta
    columns = [
        _column(Record, name)
        for name in (
            "tenant", "stream", "position", "seq", "ts", "ts_json", "event", "cd", "ph", "h", "saga_id",
            "step_id", "tool", "redacted", "verbatim", "received_at", "leaf_index", "leaf_hash",
        )
    ]  # fmt: skip
    adapt = connection.ops.adapt_datetimefield_value
    adapted: dict[Any, Any] = {}
    values = []
    for r in rows:
        when = r.received_at
        if when not in adapted:
            adapted[when] = adapt(when)
        values.append(
            (
                r.tenant_id, r.stream.pk, r.position, r.seq, r.ts, r.ts_json, r.event, r.cd, r.ph, r.h,
                r.saga_id, r.step_id, r.tool, r.redacted, r.verbatim, adapted[when], r.leaf_index,
                r.leaf_hash,
            )
        )  # fmt: skip
    table = meta.db_table
    stream_col, position_col = _column(Record, "stream"), _column(Record, "position")
    by_stream: dict[Any, list[StoredRow]] = {}
    for r in rows:
        by_stream.setdefault(r.stream.pk, []).append(r)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})", values
        )
        for stream_pk, group in by_stream.items():
            cursor.execute(
                f"SELECT {meta.pk.column}, {position_col} FROM {table} "
                f"WHERE {stream_col} = %s AND {position_col} BETWEEN %s AND %s",
                [stream_pk, min(r.position for r in group), max(r.position for r in group)],
            )
            ids = dict((position, pk) for pk, position in cursor.fetchall())
            for r in group:
                r.pk = ids[r.position]
        pmeta = RecordPayload._meta
        pcolumns = [_column(RecordPayload, name) for name in ("tenant", "record", "fields_json", "salt")]
        cursor.executemany(
            f"INSERT INTO {pmeta.db_table} ({', '.join(pcolumns)}) VALUES (%s, %s, %s, %s)",
            [(r.tenant_id, r.pk, r.fields_json, r.salt) for r in rows if r.fields_json is not None],
        )
