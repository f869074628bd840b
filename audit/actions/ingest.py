"""Writers' batches: `ingest` (a named stream, the SDK's `/v1/ingest`) and `ingest_by_linkage`
(agent-saga's `/v1/wal/ingest`, whose records name no stream), all or nothing; refusals about the
chain itself are kept as evidence."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from audit.actions.common import IngestRefused, IngestResult
from audit.actions.parsing import Incoming, parse_batch, validate_stream_id
from audit.actions.storage import ingest_into, lock_stream
from audit.actions.verification import held_by_hash
from audit.models import GENESIS, EquivocationAttempt, Record, RefusedBatch, Stream, StreamKind
from core import timing
from core.actors import Actor, stored
from core.scoping import require_tenant
from tenants.models import Tenant

# Refusals about the chain itself are kept as evidence; malformed input (400) is just answered.
KEPT_REFUSALS = (409, 422)


def _keep_evidence(
    tenant: Tenant, refusal: IngestRefused, batch: Sequence[Incoming], actor: str, stream_id: str
) -> None:
    """Called after the batch's savepoint rolled back: the records are gone, the refusal stays."""
    RefusedBatch.objects.create(
        tenant=tenant,
        stream_id=refusal.extra.get("stream") or stream_id,
        status=refusal.status,
        code=refusal.code,
        seq="" if refusal.seq is None else str(refusal.seq)[:40],
        index=refusal.index,
        detail=refusal.detail[:2000],
        record_count=len(batch),
        actor=actor,
    )
    if refusal.code != "equivocation":
        return
    offered = next((r for r in batch if r.index == refusal.index), None)
    EquivocationAttempt.objects.create(
        tenant=tenant,
        stream_id=refusal.extra.get("stream", ""),
        position=refusal.extra.get("position", 0),
        held_hash=refusal.extra.get("held_hash", ""),
        offered_hash=refusal.extra.get("offered_hash", ""),
        offered_record=json.dumps(offered.raw if offered else None, default=str),
        actor=actor,
    )


def ingest(tenant: Tenant, stream_id: str, records: Any, *, actor: Actor) -> IngestResult:
    """Verify `records` against stream `stream_id`'s head and append them, all or nothing.

    Raises IngestRefused: 400 malformed (field named), 403 reserved stream, 409 equivocation (an
    EquivocationAttempt row is kept), 422 chain broken (seq, index, reason). The caller has
    entered the tenant (the view mixin); a 409/422's evidence is written in its transaction, which
    must still commit when it answers the refusal (the mixin answers inside its transaction)."""
    require_tenant(tenant)
    validate_stream_id(stream_id)
    with timing.phase("parse"):
        batch = parse_batch(records)
    try:
        with transaction.atomic():
            stream = lock_stream(tenant, stream_id, StreamKind.AGENT)
            return ingest_into(tenant, stream, batch, actor=stored(actor))
    except IngestRefused as exc:
        if exc.status in KEPT_REFUSALS:
            # The batch is rolled back (savepoint), the evidence of the attempt is not: it is
            # written in the caller's transaction, which answers the refusal and commits.
            _keep_evidence(tenant, exc, batch, stored(actor), stream_id)
        raise


def compat_stream_name(first_hash: str) -> str:
    return f"as-{first_hash[:16]}"


def ingest_by_linkage(tenant: Tenant, records: Any, *, actor: Actor) -> list[IngestResult]:
    """agent-saga's push: records name no stream. A genesis record opens stream `as-<_h[:16]>`;
    the batch's first record, when not genesis, extends the stream whose head (or held record)
    it links to; everything else must chain on within the batch. All segments or none. In the
    caller's scope, refusals' evidence in its transaction, as `ingest`'s."""
    require_tenant(tenant)
    batch = parse_batch(records)
    segments: list[list[Incoming]] = []
    for rec in batch:
        if not segments or rec.ph == GENESIS:
            segments.append([rec])
        else:
            segments[-1].append(rec)
    results: list[IngestResult] = []
    try:
        with transaction.atomic():
            for segment in segments:
                stream_id = _attach(segment[0])
                stream = lock_stream(tenant, stream_id, StreamKind.AGENT)
                results.append(ingest_into(tenant, stream, segment, actor=stored(actor)))
            return results
    except IngestRefused as exc:
        if exc.status in KEPT_REFUSALS:
            _keep_evidence(tenant, exc, batch, stored(actor), "agent-saga push")
        raise


def _attach(first: Incoming) -> str:
    """Which stream a segment belongs to, by chain linkage."""
    if first.ph == GENESIS:
        # Already held (a re-push, or the same WAL shipped by the SDK under its own name)? A
        # chain's first record, through the partial index of position 1.
        held = Record.objects.filter(h=first.h, position=1).values_list("stream__stream_id", flat=True)
        return next(iter(held[:1]), None) or compat_stream_name(first.h)
    for h in (first.ph, first.h):
        stream_id = (
            Stream.objects.filter(head_hash=h, kind=StreamKind.AGENT)
            .values_list("stream_id", flat=True)
            .first()
        )
        if stream_id is not None:
            return stream_id
        # An older segment (a re-push after the stream moved on): where it is held, anywhere.
        held = held_by_hash(Record.objects.all(), h).values_list("stream__stream_id", flat=True)
        stream_id = next(iter(held[:1]), None)
        if stream_id is not None:
            return stream_id
    # Linked to nothing held: a WAL whose beginning was compacted away before it was shipped.
    return compat_stream_name(first.h)
