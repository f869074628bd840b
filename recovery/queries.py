"""Recovery's vendor-specific SQL, all of it (issue 25): each query answers the same on every
database (tests/recovery/test_queries.py runs each on Postgres and on SQLite); elsewhere recovery
speaks the ORM, and its claims go through `core.claims`.

- `insert_jobs`: on Postgres one INSERT from one JSON document, elsewhere `bulk_create`;
- `takeover_turn`: on Postgres a per-tenant advisory lock, tried; on SQLite always granted (its
  write transactions already run one at a time).

The tenant is each query's argument or row column, never the active scope: these run inside the
caller's tenant transaction, and on SQLite nothing else would filter them.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from django.db import connection

from core.sql import is_postgres
from recovery.models import Job
from tenants.models import Tenant

_JOB_COLUMNS: frozenset[str] = frozenset(str(field.column) for field in Job._meta.concrete_fields)


def insert_jobs(rows: list[dict[str, Any]]) -> None:
    """Insert new jobs (every column given, by column name). On Postgres one INSERT from one JSON
    document (`json_populate_recordset` over the table's row type): a takeover of a thousand
    sagas spent seconds in bulk_create's per-field preparation. Elsewhere bulk_create."""
    if not rows:
        return
    if set(rows[0]) != _JOB_COLUMNS:  # the model gained or lost a column: keep this in step
        raise RuntimeError(f"job rows name {sorted(set(rows[0]) ^ _JOB_COLUMNS)} wrongly")
    if not is_postgres():
        Job.objects.bulk_create([Job(**row) for row in rows])
        return
    table = connection.ops.quote_name(Job._meta.db_table)
    document = json.dumps(rows, default=_json_value, separators=(",", ":"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, %s::json)",  # noqa: S608 (the model's table name)
            [document],
        )


def _json_value(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} in a job row")


# pg_try_advisory_xact_lock's first key: "recovery takeover"; the second is the tenant.
_TAKEOVER_LOCK_CLASS = 0x5245_4356


def takeover_turn(tenant: Tenant) -> bool:
    """Inside a transaction: whether this transaction may take the tenant's expired leases over
    now. Postgres: a transaction-scoped advisory lock per tenant, tried, never waited for (the
    other taker is doing it). SQLite: always (write transactions already run one at a time)."""
    if not is_postgres():
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_TAKEOVER_LOCK_CLASS, tenant.pk % 2**31])
        row = cursor.fetchone()
    return bool(row and row[0])
