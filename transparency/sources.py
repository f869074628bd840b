"""The one place the transparency log reads the record store.

The log is about leaves, not records: it needs each leaf's hash in leaf order, and (for
disclosures and exports) the record behind a leaf with its stream and chain position. The audit
context owns those rows; these functions read its models, so the audit schema can move without
touching the tree code. The one exception is the leaf hashes the integrator extends the tree with:
one plain statement, `transparency.queries.leaf_hashes` (with the log's other vendor SQL).

Every function runs with the tenant already active (tenant_context). Which tenants have grown
logs is a cross-tenant question: `transparency.cross_tenant.tenants_to_integrate`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Max, Min
from sagaplane.events import Event
from sagaplane.leaf import leaf_data

from audit import services as audit_services
from audit.models import SERVER_STREAM_ID, Record, RecordPayload, Stream, TenantLog
from core.actors import Actor
from sagas.models import TERMINAL_STATUSES, Saga
from tenants.models import Tenant


@dataclass(frozen=True)
class LeafRecord:
    """A record at its place in the log. `record` is the WAL JSON as stored (a redacted stub
    after erasure): chain fields included, so a verifier can recompute `_cd`, `_h` and the leaf."""

    leaf_index: int
    stream_id: str
    position: int
    record: dict[str, Any]
    leaf_hash: bytes


# Leaves come from `audit.models.Record` (leaf_index, leaf_hash assigned at ingest).
_CHUNK = 2_000


def log_size(tenant: Tenant) -> int:
    """How many leaves the tenant's log has been assigned (contiguous from 0)."""
    return TenantLog.objects.values_list("size", flat=True).first() or 0


def _as_leaf(row: Any) -> LeafRecord:
    payload = getattr(row, "payload", None)
    redaction = getattr(row, "redaction", None)
    return LeafRecord(
        leaf_index=row.leaf_index,
        stream_id=row.stream.stream_id,
        position=row.position,
        record=audit_services.stored_record(
            row, payload, redaction.reason if redaction is not None else None
        ),
        leaf_hash=bytes(row.leaf_hash),
    )


def _rows() -> Any:
    return Record.objects.select_related("stream", "payload", "redaction").order_by("leaf_index")


def records(tenant: Tenant, start: int, end: int) -> Iterator[LeafRecord]:
    """Records of leaves [start, end), in leaf order, streamed."""
    # Keyset pagination on leaf_index: constant memory for any export size.
    position = start
    while position < end:
        chunk = list(_rows().filter(leaf_index__gte=position, leaf_index__lt=min(end, position + _CHUNK)))
        if not chunk:
            return
        for row in chunk:
            yield _as_leaf(row)
        position = chunk[-1].leaf_index + 1


def leaf_entries(tenant: Tenant, start: int, end: int) -> list[bytes]:
    """Leaf data (the bytes whose RFC 6962 leaf hash is in the tree) of leaves [start, end),
    in leaf order; stops short at the first missing leaf."""
    # Header columns only (no payload join): an entry bundle is at most 256 small rows.
    rows = (
        Record.objects.filter(leaf_index__gte=start, leaf_index__lt=end)
        .order_by("leaf_index")
        .values_list("leaf_index", "stream__stream_id", "position", "h")
    )
    out: list[bytes] = []
    for index, stream_id, position, record_hash in rows:
        if index != start + len(out):
            break  # a hole: the caller sees a short list and refuses
        out.append(leaf_data(stream_id, position, record_hash))
    return out


def saga_records(tenant: Tenant, saga_id: str) -> list[LeafRecord]:
    """Every record about the saga (its own, approvals, recovery, seals), in leaf order."""
    return [_as_leaf(row) for row in _rows().filter(saga_id=saga_id)]


# What the integrator appends to the server stream when a saga ends (transparency.services).
SEAL_EVENT = Event.SAGA_SEALED


@dataclass(frozen=True, slots=True)
class SealInput:
    """One record of a saga as a seal is computed from it: its leaf, and `record` holding only
    `event`, `_h` and (for an earlier seal, or any record of a saga whose id's index copy is not
    exact) the payload fields."""

    leaf_index: int
    record: dict[str, Any]


# A seal pass reads the records of the sagas it seals by one leaf range, over those whose records
# all lie within this many leaves of its stretch (a saga that started long before it, or reaches
# far past it, is read by saga id instead).
SEAL_RANGE_SLACK = 50_000
# A saga's (first, last) leaf index as the projection holds them (None: not known).
Span = tuple[int | None, int | None]
# Sagas whose records one statement reads by saga id.
_SEAL_READ_SAGAS = 500


def seal_inputs(tenant: Tenant, sagas: dict[str, Span], start: int, end: int) -> dict[str, list[SealInput]]:
    """What a seal pass over leaves [start, end) reads of the sagas it may seal ({saga id: its
    span}): {saga id: its records in leaf order}. Header columns only, the payload JSON only
    where a seal needs it (earlier seals, and sagas whose id's index copy is not exact). An
    erased payload reads as absent.

    Most of a pass's sagas lie within or just around its stretch: their records are read by one
    scan of the leaf range their spans cover (the (tenant, leaf_index) index, which the planner
    picks whatever its statistics say; by saga id it preferred scanning the whole tenant while a
    fresh tenant's statistics were stale, every pass). A saga's span is the projection's,
    maintained with its records under the tenant log lock, in leaf order: no record of the saga
    read with it lies outside it (one committed since lies past the seal watermark, and a later
    pass seals it). Other sagas (and any without a span) are read by saga id."""
    near: dict[str, tuple[int, int]] = {
        saga_id: (first, last)
        for saga_id, (first, last) in sagas.items()
        if first is not None
        and last is not None
        and first >= start - SEAL_RANGE_SLACK
        and last < end + SEAL_RANGE_SLACK
    }
    far = sorted(set(sagas) - set(near))
    found: dict[str, list[tuple[int, int, str, str]]] = {}  # saga id: (pk, leaf, _h, event)
    if near:
        lowest = min(first for first, _ in near.values())
        highest = max(last for _, last in near.values())
        in_range = Record.objects.filter(leaf_index__gte=lowest, leaf_index__lte=highest).exclude(saga_id="")
        _read_headers(in_range, set(near), found)
    for first in range(0, len(far), _SEAL_READ_SAGAS):
        chunk = far[first : first + _SEAL_READ_SAGAS]
        _read_headers(Record.objects.filter(saga_id__in=chunk), set(chunk), found)
    # Payloads only where a seal is computed from them: every record of a saga whose id's index
    # copy is not exact (the exact id is in the payload), and a saga's latest seal when no record
    # of the saga follows it (then it may be current; a seal lists only records before it, so one
    # followed by a record is stale without reading it). Under sustained ingest, hardly any.
    wanted: list[int] = []
    for saga_id, rows in found.items():
        if "\ufffd" in saga_id:
            wanted.extend(pk for pk, _, _, _ in rows)
        elif rows[-1][3] == SEAL_EVENT:
            wanted.append(rows[-1][0])
    payloads = dict(RecordPayload.objects.filter(record_id__in=wanted).values_list("record", "fields_json"))
    out: dict[str, list[SealInput]] = {}
    for saga_id, rows in found.items():
        inputs = out[saga_id] = []
        for pk, leaf_index, h, event in rows:
            stored = payloads.get(pk)
            record: dict[str, Any] = json.loads(stored) if stored is not None else {}
            record.update(event=event, _h=h)
            inputs.append(SealInput(leaf_index, record))
    return out


def _read_headers(records: Any, wanted: set[str], out: dict[str, list[tuple[int, int, str, str]]]) -> None:
    rows = records.order_by("leaf_index").values_list("saga_id", "pk", "leaf_index", "h", "event")
    for saga_id, pk, leaf_index, h, event in rows:
        if saga_id in wanted:
            out.setdefault(saga_id, []).append((pk, leaf_index, h, event))


def leaf_range_for_time(tenant: Tenant, since: datetime | None, until: datetime | None) -> tuple[int, int]:
    """[first, end) of the leaves accepted in [since, until)."""
    rows = Record.objects.all()
    if since is not None:
        rows = rows.filter(received_at__gte=since)
    if until is not None:
        rows = rows.filter(received_at__lt=until)
    bounds = rows.aggregate(first=Min("leaf_index"), last=Max("leaf_index"))
    if bounds["first"] is None:
        return 0, 0
    return bounds["first"], bounds["last"] + 1


def terminal_sagas_touched(tenant: Tenant, start: int, end: int) -> dict[str, Span]:
    """Sagas with a record in leaves [start, end) whose projected status is terminal, with their
    spans, in saga id order. The server's own seals do not count as
    touching their saga: a seal lists the saga's records and is not one of them, so it cannot make
    a seal stale, and every seal is computed under the tree lock from records read while the seal
    watermark was below them (so a record a seal missed is past the watermark and brings its saga
    back by itself). Counting them made every pass re-read every saga the previous pass sealed."""
    server = Stream.objects.filter(stream_id=SERVER_STREAM_ID).values_list("pk", flat=True).first()
    touched = Record.objects.filter(leaf_index__gte=start, leaf_index__lt=end).exclude(saga_id="")
    if server is not None:
        touched = touched.exclude(event=SEAL_EVENT, stream_id=server)
    saga_ids = list(touched.values_list("saga_id", flat=True).distinct())
    # Two statements, not one with a subquery: with a fresh tenant's statistics missing, the
    # planner once ran that subquery per saga (minutes for one pass).
    rows = (
        Saga.objects.filter(saga_id__in=saga_ids, status__in=list(TERMINAL_STATUSES))
        .order_by("saga_id")
        .values_list("saga_id", "first_leaf_index", "last_leaf_index")
    )
    return {saga_id: (first, last) for saga_id, first, last in rows}


def server_stream_id() -> str:
    """The stream the server appends its own records (and seals) to."""
    return SERVER_STREAM_ID


def append_server_record(tenant: Tenant, event: str, fields: dict[str, Any], *, actor: Actor) -> None:
    """Append a chained record to the tenant's own server stream (gets the next leaf)."""
    audit_services.append_server_record(tenant, event, fields, actor=actor)


def append_server_records(tenant: Tenant, entries: list[tuple[str, dict[str, Any]]], *, actor: Actor) -> int:
    """Append several chained records (event, fields) to the server stream as one batch; the
    first one's leaf index (the rest follow it contiguously)."""
    return audit_services.append_server_records(tenant, entries, actor=actor).rows[0].leaf_index
