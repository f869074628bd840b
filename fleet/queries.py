"""The fleet's SQL written for a database rather than through the ORM, in one place: where the ORM
costs the hot path more than the statement itself. Each query answers the same on Postgres and
SQLite (tests/fleet/test_queries.py runs each on both), and each takes the tenant as its first
argument: its rows are the tenant's, and on Postgres its row-level security setting is set by the
same statement (core.scoping's `statement_prefix`), so no caller adds a tenant filter by hand.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import connection

from core.scoping import statement_prefix
from core.sql import is_postgres
from fleet.gate import GateRequest
from fleet.models import Decision, GateDecision

_LEDGER = GateDecision._meta.db_table
_LEDGER_COLUMNS = (
    "id",
    "tenant_id",
    "idempotency_key",
    "saga_id",
    "step_id",
    "tool",
    "agent",
    "api_key_prefix",
    "args_digest",
    "decision",
    "reason",
    "detail",
    "debits",
    "decided_at",
)
_INSERT = f"INSERT INTO {_LEDGER} ({', '.join(_LEDGER_COLUMNS)}) VALUES ({{values}}) "
# An allow whose idempotency key already has one inserts nothing and returns no id (the first stands).
_ONCE = "ON CONFLICT (tenant_id, idempotency_key) WHERE decision = 'allow' DO NOTHING RETURNING id"
# One batch, one round trip: the tenant for row-level security (SET LOCAL) and the row, in one
# implicit transaction that has committed -- the row is durable -- when the batch answers.
# A refusal's row is a dashboard entry, not a ledger entry (it debited nothing; the agent's WAL
# keeps its own GATE_DENY): its commit does not wait for the WAL flush (synchronous_commit off
# for that transaction alone), so refusals cost no fsync; an allow's commits as the server is
# configured (waiting for the flush, and for synchronous standbys where there are).
# The settings are core.scoping's statement prefix, the one statement-scoped path.
_ON_POSTGRES = (
    _INSERT.format(values="%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s") + _ONCE
)
_ON_SQLITE = _INSERT.format(values=", ".join(["%s"] * len(_LEDGER_COLUMNS))) + _ONCE


def one_statement_ledger() -> bool:
    """Whether `insert_decision` saves a round trip over the ORM's transaction (Postgres: the
    tenant's setting, the row and its commit in one batch). The lean gate path runs only there."""
    return is_postgres()


def insert_decision(
    tenant_id: int,
    request: GateRequest,
    decision: Decision,
    *,
    row_id: uuid.UUID,
    reason: str,
    detail_json: str,
    debits_json: str,
    decided_at: datetime,
) -> bool:
    """Insert one decision of the tenant's ledger, outside any transaction (committed when this
    answers). False when the row is an allow and one under its idempotency key exists (nothing
    inserted: the first stands)."""
    values: list[Any] = [
        row_id,
        tenant_id,
        request.idempotency_key,
        request.saga_id,
        request.step_id,
        request.tool,
        request.agent,
        request.api_key_prefix,
        request.args_digest,
        decision.value,
        reason,
        detail_json,
        debits_json,
        decided_at,
    ]
    with connection.cursor() as cursor:
        if is_postgres():
            # An allow commits as configured; a refusal does not wait for the flush.
            prefix = statement_prefix(tenant_id, synchronous_commit_off=decision != Decision.ALLOW)
            cursor.execute(prefix + _ON_POSTGRES, values)
            cursor.nextset()
        else:
            values[0] = row_id.hex  # how Django stores a UUID there
            values[-1] = connection.ops.adapt_datetimefield_value(decided_at)
            cursor.execute(_ON_SQLITE, values)
        return cursor.fetchone() is not None
