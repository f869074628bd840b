"""Read-only questions about the evidence store, for the API and the pages (which never query
`audit.models` themselves). Every query runs under the active tenant (TenantScopedModel)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sagaplane.events import Event

from audit.models import Record, RecordPayload, Redaction, RefusedBatch, Stream, StreamKind, TenantLog
from audit.services import stored_record


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record header with the record in WAL form as stored (`stored_record`): what the writer
    sent, or its redacted stub when the payload is gone (`erased`)."""

    record: Record
    body: dict[str, Any]
    erased: bool


def saga_records(saga_id: str) -> list[StoredRecord]:
    """Every record about the saga, in log (leaf) order: three queries whatever their number."""
    records = list(Record.objects.select_related("stream").filter(saga_id=saga_id).order_by("leaf_index"))
    ids = [r.pk for r in records]
    payloads = {p.record_id: p for p in RecordPayload.objects.filter(record_id__in=ids)}
    erased = dict(Redaction.objects.filter(record_id__in=ids).values_list("record_id", "reason"))
    return [
        StoredRecord(r, stored_record(r, payloads.get(r.pk), erased.get(r.pk)), r.pk not in payloads)
        for r in records
    ]


def log_size() -> int:
    """How many records the tenant's log holds (its leaves)."""
    return TenantLog.objects.values_list("size", flat=True).first() or 0


def agent_stream_ids(limit: int = 200) -> list[str]:
    """The ids of the tenant's agent streams, sorted (at most `limit`; one index range)."""
    agents = Stream.objects.filter(kind=StreamKind.AGENT).order_by("stream_id")
    return list(agents.values_list("stream_id", flat=True)[:limit])


@dataclass(frozen=True, slots=True)
class StreamStatus:
    stream: Stream
    last: Record | None
    refused: list[RefusedBatch]  # the latest few
    refused_count: int


def stream_statuses(streams: int = 200, refusals: int = 500, refusals_each: int = 5) -> list[StreamStatus]:
    """The most recently written streams, each with its last record and the refused batches
    (equivocations, broken chains) that named it, newest first."""
    refused: dict[str, list[RefusedBatch]] = {}
    for attempt in RefusedBatch.objects.order_by("-received_at")[:refusals]:
        refused.setdefault(attempt.stream_id, []).append(attempt)
    out = []
    for stream in Stream.objects.order_by("-updated_at")[:streams]:
        last = Record.objects.filter(stream=stream).order_by("-position").first()
        attempts = refused.get(stream.stream_id, [])
        out.append(StreamStatus(stream, last, attempts[:refusals_each], len(attempts)))
    return out


@dataclass(frozen=True, slots=True)
class RecordHeader:
    leaf_index: int
    stream_id: str
    event: str
    saga_id: str
    step_id: str
    tool: str


def headers_between(start: int, end: int, events: tuple[str, ...]) -> list[RecordHeader]:
    """Headers (index copies) of the records at leaf indices [start, end) whose event is one of
    `events`, in leaf order (a range scan of the leaf index)."""
    rows = (
        Record.objects.filter(leaf_index__gte=start, leaf_index__lt=end, event__in=events)
        .order_by("leaf_index")
        .values_list("leaf_index", "stream__stream_id", "event", "saga_id", "step_id", "tool")
    )
    return [RecordHeader(*row) for row in rows]


@dataclass(frozen=True, slots=True)
class StepCall:
    """A step's call as its agent recorded it (STEP_INTENT or STEP_REFUSED): tool, semantics and
    arguments by name."""

    saga_id: str
    step_id: str
    tool: str
    semantics: str
    kwargs: dict[str, Any]
    received_at: Any


STEP_CALL_EVENTS = (Event.STEP_INTENT, Event.STEP_REFUSED)


def step_calls_since(since: Any, scan: int) -> tuple[list[StepCall], bool]:
    """The steps' calls received since `since`, newest first, read from at most the newest `scan`
    records of the log (a range of the leaf index: bounded whatever the log's size), one per step;
    and whether the range ended before `since` was reached (older calls not read)."""
    size = log_size()
    start = max(0, size - scan)
    headers = list(
        Record.objects.filter(leaf_index__gte=start, event__in=STEP_CALL_EVENTS, received_at__gte=since)
        .order_by("-leaf_index")
        .values_list("pk", "saga_id", "step_id", "tool", "received_at")
    )
    payloads = dict(
        RecordPayload.objects.filter(record_id__in=[h[0] for h in headers]).values_list(
            "record_id", "fields_json"
        )
    )
    seen: set[tuple[str, str]] = set()
    calls = []
    for pk, saga_id, step_id, tool, received_at in headers:
        if (saga_id, step_id) in seen or pk not in payloads:  # an erased payload: no arguments
            continue
        seen.add((saga_id, step_id))
        try:
            fields = json.loads(payloads[pk])
        except ValueError:
            continue
        kwargs = fields.get("kwargs") if isinstance(fields, dict) else None
        semantics = fields.get("semantics") if isinstance(fields, dict) else ""
        calls.append(
            StepCall(
                saga_id,
                step_id,
                tool,
                semantics if isinstance(semantics, str) else "",
                kwargs if isinstance(kwargs, dict) else {},
                received_at,
            )
        )
    truncated = start > 0 and not Record.objects.filter(leaf_index=start - 1, received_at__lt=since).exists()
    return calls, truncated
