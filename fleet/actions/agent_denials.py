"""Refusals the agent's SDK made on its own, projected into the denials the console lists.

The SDK refuses some calls without asking the gate (its last fleet state shows a halt or an open
breaker, the control plane cannot be read, the tool is outside its policy file) and records each
refusal, as it records the gate's, as a GATE_DENY in its WAL. `watch_appended` is subscribed to
`audit.hooks.on_records_appended`: in the ingest's transaction, every shipped GATE_DENY becomes a
`GateDecision` row with `source="agent"` (tool, reason, the agent's name, its stream, the record's
time), so `fleet.selectors.denials` reads one list. A GATE_DENY whose answer carries the gate's
`decision_id` is the gate's own refusal, already a row: it is not projected again.

Set-based: a batch without refusals costs nothing; one with refusals costs one read of the
sagas' agent names and one insert, whatever their number.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from sagaplane.events import Event

from audit.hooks import AppendedRecords, OnStored
from core.actors import api_key_prefix_of
from fleet.models import Decision, GateDecision, Source
from sagas.models import Saga
from sagas.services import agent_label

# What of the SDK's answer the console explains a refusal with (`frontend.fleet_views._why`).
DETAIL_KEYS = ("scope", "halt_reason", "breaker", "message", "limit", "retry_after", "approval_id")
TEXT_MAX = 200


def watch_appended(appended: AppendedRecords) -> OnStored:
    """`audit.hooks` subscriber: the batch's agent-side refusals, written once the records are."""
    refusals = [
        (row, fields)
        for row, fields in appended.items
        if row.event == Event.GATE_DENY and fields and not _gate_decided(fields)
    ]
    rows = _rows(appended, refusals) if refusals else []

    def stored(_base: int) -> None:
        if rows:
            GateDecision.objects.bulk_create(rows)

    return stored


def _gate_decided(fields: dict[str, Any]) -> bool:
    answer = fields.get("answer")
    return isinstance(answer, dict) and bool(answer.get("decision_id"))


def _rows(appended: AppendedRecords, refusals: Sequence[tuple[Any, dict[str, Any]]]) -> list[GateDecision]:
    saga_ids = sorted({str(row.saga_id) for row, _ in refusals if row.saga_id})
    agents = dict(Saga.objects.filter(saga_id__in=saga_ids).values_list("saga_id", "agent"))
    for row, fields in appended.items:  # the batch's own starts name agents not projected yet
        if row.event == Event.SAGA_START and isinstance(fields.get("agent"), str):
            agents[row.saga_id] = agent_label(fields["agent"])
    now = timezone.now()
    prefix = api_key_prefix_of(appended.actor)[:12]
    return [
        GateDecision(
            tenant=appended.tenant,
            idempotency_key="",
            saga_id=str(row.saga_id)[:128],
            step_id=str(row.step_id)[:128],
            tool=str(row.tool)[:200],
            agent=agents.get(row.saga_id, "")[:100],
            api_key_prefix=prefix,
            args_digest="",
            decision=Decision.DENY,
            reason=_text(fields.get("reason"))[:40] or "denied",
            detail=_detail(fields.get("answer")),
            decided_at=_when(row.ts, now),
            source=Source.AGENT,
            stream_id=appended.stream_id[:200],
        )
        for row, fields in refusals
    ]


def _text(value: Any) -> str:
    return value[:TEXT_MAX] if isinstance(value, str) else ""


def _detail(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, dict):
        return {}
    kept: dict[str, Any] = {}
    for key in DETAIL_KEYS:
        value = answer.get(key)
        if isinstance(value, str):
            kept[key] = value[:TEXT_MAX]
        elif type(value) is int and abs(value) < 10**12:
            kept[key] = value
    return kept


def _when(ts: float, now: datetime) -> datetime:
    """The record's time; one the agent's clock put in the future (or that is no time) is shown
    as received, so it never stays above every later refusal."""
    try:
        when = datetime.fromtimestamp(ts, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return now
    return min(when, now)
