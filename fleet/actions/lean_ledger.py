"""The lean path's ledger write: one decision in one round trip, outside any transaction."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection
from django.utils import timezone

from controlplane import availability
from fleet.gate import Debit, GateRequest
from fleet.models import Decision, GateDecision
from tenants.models import Tenant
from tenants.scoping import TENANT_SETTING, tenant_context

log = logging.getLogger(__name__)


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
# One batch, one round trip: the tenant for row-level security (SET LOCAL) and the row, in one
# implicit transaction that has committed -- the row is durable -- when the batch answers. An allow
# whose idempotency key already has one inserts nothing and returns no id (the first stands).
# A refusal's row is a dashboard entry, not a ledger entry (it debited nothing; the agent's WAL
# keeps its own GATE_DENY): its commit does not wait for the WAL flush (synchronous_commit off
# for that transaction alone), so refusals cost no fsync; an allow's commits as the server is
# configured (waiting for the flush, and for synchronous standbys where there are).
_LEDGER_BATCH = (
    f"SELECT set_config('{TENANT_SETTING}', %s, true), "
    "set_config('synchronous_commit', coalesce(%s, current_setting('synchronous_commit')), true); "
    f"INSERT INTO {_LEDGER} ({', '.join(_LEDGER_COLUMNS)}) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s) "
    "ON CONFLICT (tenant_id, idempotency_key) WHERE decision = 'allow' DO NOTHING RETURNING id"
)


def write_lean(
    tenant: Tenant,
    request: GateRequest,
    decision: Decision,
    *,
    reason: str = "",
    detail: dict[str, Any] | None = None,
    decision_id: uuid.UUID | None = None,
    debits: Sequence[Debit] = (),
) -> dict[str, Any]:
    """Write one decision in one round trip (`_LEDGER_BATCH`) outside any transaction, and answer
    it. An allow is answered only once its row has committed; a ledger that cannot be written
    refuses (`limit_store_unavailable`: any debit already made stays, erring toward refusal)."""
    detail = detail or {}
    row_id = decision_id or uuid.uuid4()
    params: list[Any] = [
        str(tenant.pk),
        "off" if decision == Decision.DENY else None,  # an allow: as the server is configured
        row_id,
        tenant.pk,
        request.idempotency_key,
        request.saga_id,
        request.step_id,
        request.tool,
        request.agent,
        request.api_key_prefix,
        request.args_digest,
        decision.value,
        reason,
        json.dumps(detail, cls=DjangoJSONEncoder),
        json.dumps([d.as_ledger() for d in debits]),
        timezone.now(),
    ]
    try:
        with connection.cursor() as cursor:
            cursor.execute(_LEDGER_BATCH, params)
            cursor.nextset()
            inserted = cursor.fetchone() is not None
    except DatabaseError as exc:
        outage = availability.failed(exc)
        if outage is not None:  # any debit already made stays: erring toward refusal
            raise outage from exc
        log.warning("gate: ledger unavailable for tenant %s: %s", tenant.pk, exc)
        if decision == Decision.DENY:
            return {"decision": "deny", "reason": reason, **detail}
        return {"decision": "deny", "reason": "limit_store_unavailable", "retry_after": 1}
    if decision == Decision.DENY:
        return {"decision": "deny", "reason": reason, **detail}
    if not inserted:
        # The same call allowed meanwhile (a retry racing itself): the first allow stands; this
        # debit stays counted, erring toward refusal.
        with tenant_context(tenant):
            first = GateDecision.objects.get(idempotency_key=request.idempotency_key, decision=Decision.ALLOW)
        return first.answer()
    return {"decision": "allow", "authorization_id": str(row_id)}
