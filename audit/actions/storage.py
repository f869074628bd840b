"""Storage: the planned records appended under the stream's and the tenant log's locks (leaf
indices, headers, payloads, the stream head) and handed to the subscribers of `audit.hooks`."""

from __future__ import annotations

import json

from django.utils import timezone
from sagaplane.leaf import leaf_data
from sagaplane.merkle import leaf_hash

from audit import hooks, queries
from audit.actions.common import IngestRefused, IngestResult
from audit.actions.parsing import Incoming
from audit.actions.verification import Plan, plan_batch
from audit.jsonvalues import index_text
from audit.models import Stream
from core import timing
from tenants.models import Tenant


def lock_stream(tenant: Tenant, stream_id: str, kind: str) -> Stream:
    """The stream row, locked until the transaction ends: concurrent extenders serialise here."""
    stream = Stream.objects.select_for_update().filter(stream_id=stream_id).first()
    if stream is None:
        # Insert-or-nothing, then lock: two first batches for a new stream cannot both create it.
        Stream.objects.bulk_create(
            [Stream(tenant=tenant, stream_id=stream_id, kind=kind)], ignore_conflicts=True
        )
        stream = Stream.objects.select_for_update().get(stream_id=stream_id)
    if stream.kind != kind:
        raise IngestRefused(
            "reserved_stream",
            f"stream '{stream_id}' is written by the server only",
            status=403,
            field="stream",
        )
    return stream


def _verbatim(rec: Incoming) -> str:
    """Record.verbatim: the header text a column could not hold as sent (see the model)."""
    sent = {"event": rec.event, "_redacted": rec.redacted}
    if all("\x00" not in value for value in sent.values()):
        return ""
    return json.dumps({name: value for name, value in sent.items() if value})


def _store(tenant: Tenant, stream: Stream, plan: Plan, *, actor: str) -> list[queries.StoredRow]:
    """Append the planned records: leaf indices under the tenant log lock, headers then payloads,
    the stream head, and what the subscribers of `audit.hooks` do with them (the saga projection
    in the transaction; the live event and the integration request after commit).

    Everything that needs no lock (leaf hashes, payload JSON) is computed before the tenant log is
    locked, so the section that serialises a tenant's ingests is a few set-based statements."""
    now = timezone.now()
    stream_name = stream.stream_id
    with timing.phase("rows"):  # leaf hashes, payload JSON: no lock, no statement
        rows = [
            queries.StoredRow(
                tenant.pk,
                stream,
                position,
                rec.seq,
                float(rec.ts),
                repr(rec.ts),  # == json.dumps for the int or finite float parse_batch admits
                index_text(rec.event),
                rec.cd,
                rec.ph,
                rec.h,
                index_text(rec.business.get("saga_id") or ""),
                index_text(rec.business.get("step_id") or ""),
                index_text(rec.business.get("tool") or ""),
                index_text(rec.redacted),
                leaf_hash(leaf_data(stream_name, position, rec.h)),
                # ASCII JSON: any string (NUL, any code point), NaN, Infinity and any int, exactly.
                None if rec.redacted else json.dumps(rec.business),
                rec.salt,
                _verbatim(rec),
            )
            for rec, position in plan.new
        ]
        appended = hooks.AppendedRecords(
            tenant,
            stream_name,
            [(row, rec.business) for row, (rec, _) in zip(rows, plan.new, strict=True)],
            actor,
        )
    with timing.phase("insert_payloads"):
        # No lock needed yet (same transaction): header ids and payloads; subscribers read and fold
        # now too (the saga projection, on Postgres), and re-check under the lock before they write.
        queries.prepare_records(rows)
    with timing.phase("projection_fold"):
        on_stored = hooks.records_appending(appended)
    queries.wait_for_log(tenant.pk)  # the tenant's appends serialise here (gapless leaf indices)
    with timing.phase("insert_locked"):
        base = queries.append(tenant.pk, stream, now, rows)
    with timing.phase("projection_write"):
        hooks.records_stored(appended, on_stored, base)
    return rows


def ingest_into(tenant: Tenant, stream: Stream, batch: list[Incoming], *, actor: str) -> IngestResult:
    with timing.phase("verify"):
        plan = plan_batch(stream, batch)
    return store_planned(tenant, stream, plan, actor=actor)


def store_planned(tenant: Tenant, stream: Stream, plan: Plan, *, actor: str) -> IngestResult:
    stored = _store(tenant, stream, plan, actor=actor) if plan.new else []
    return IngestResult(
        stream.stream_id, len(plan.new), plan.duplicates, stream.head_seq, stream.head_hash, stored
    )
