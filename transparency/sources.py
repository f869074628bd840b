"""The one place the transparency log reads the record store.

The log is about leaves, not records: it needs each leaf's hash in leaf order, and (for
disclosures and exports) the record behind a leaf with its stream and chain position. The audit
context owns those rows; these functions read its models, so the audit schema can move without
touching the tree code.

Every function runs with the tenant already active (tenant_context). Which tenants have grown
logs is a cross-tenant question: `transparency.cross_tenant.tenants_to_integrate`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Max, Min
from sagaplane.leaf import leaf_data

from audit import services as audit_services
from audit.models import SERVER_STREAM_ID, Record, TenantLog
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


def leaf_hashes(tenant: Tenant, start: int, end: int) -> list[bytes]:
    """Stored leaf hashes of leaves [start, end), in leaf order; stops short at a hole.

    One statement on the (tenant, leaf_index) unique index, through a plain cursor: the ORM's
    per-row model machinery cost more than the read itself for a round of 50,000 leaves."""
    quote = connection.ops.quote_name
    sql = (
        f"SELECT leaf_index, leaf_hash FROM {quote(Record._meta.db_table)} "
        "WHERE tenant_id = %s AND leaf_index >= %s AND leaf_index < %s ORDER BY leaf_index"
    )
    out: list[bytes] = []
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant.pk, start, end])
        for expected, (index, digest) in enumerate(cursor.fetchall(), start):
            if index != expected:
                break  # a hole: the caller sees a short list and refuses
            out.append(bytes(digest))
    return out


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


def seal_inputs(tenant: Tenant, saga_ids: list[str], seal_event: str) -> dict[str, list[LeafRecord]]:
    """What a seal pass reads of several sagas, with one statement: {saga id: its records in leaf
    order}, each `record` holding only what a seal is computed from (`event`, `_h`, and the
    payload fields of earlier seals, or of every record of a saga whose id's index copy is not
    exact), not the whole stored record: building 90,000 model instances per pass was most of it.
    An erased payload reads as absent, as in `stored_record`."""
    out: dict[str, list[LeafRecord]] = {}
    rows = (
        Record.objects.filter(saga_id__in=saga_ids)
        .order_by("leaf_index")
        .values_list(
            "leaf_index",
            "stream__stream_id",
            "position",
            "h",
            "event",
            "saga_id",
            "leaf_hash",
            "payload__fields_json",
        )
    )
    for leaf_index, stream_id, position, h, event, saga_id, digest, fields_json in rows:
        record: dict[str, Any] = {}
        if fields_json is not None and (event == seal_event or "\ufffd" in saga_id):
            record.update(json.loads(fields_json))
        record.update(event=event, _h=h)
        out.setdefault(saga_id, []).append(LeafRecord(leaf_index, stream_id, position, record, bytes(digest)))
    return out


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


def terminal_sagas_touched(tenant: Tenant, start: int, end: int) -> list[str]:
    """Sagas with a record in leaves [start, end) whose projected status is terminal."""
    touched = (
        Record.objects.filter(leaf_index__gte=start, leaf_index__lt=end)
        .exclude(saga_id="")
        .values_list("saga_id", flat=True)
        .distinct()
    )
    return sorted(
        Saga.objects.filter(saga_id__in=list(touched), status__in=list(TERMINAL_STATUSES)).values_list(
            "saga_id", flat=True
        )
    )


def server_stream_id() -> str:
    """The stream the server appends its own records (and seals) to."""
    return SERVER_STREAM_ID


def append_server_record(tenant: Tenant, event: str, fields: dict[str, Any], *, actor: str) -> None:
    """Append a chained record to the tenant's own server stream (gets the next leaf)."""
    audit_services.append_server_record(tenant, event, fields, actor=actor)


def append_server_records(tenant: Tenant, entries: list[tuple[str, dict[str, Any]]], *, actor: str) -> None:
    """Append several chained records (event, fields) to the server stream as one batch."""
    audit_services.append_server_records(tenant, entries, actor=actor)
