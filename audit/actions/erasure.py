"""Erasure: a record's payload deleted (its header, hash and leaf kept), recorded in the server
stream; and a stored record in WAL form, what the writer sent or its redacted stub."""

from __future__ import annotations

from typing import Any

from sagaplane.events import Event

from audit import hooks
from audit.actions.common import IngestRefused
from audit.actions.server_stream import append_server_record
from audit.actions.verification import held_by_hash
from audit.models import Record, RecordPayload, Redaction, Stream
from core.actors import Actor, stored
from core.scoping import require_tenant
from tenants.models import Tenant


def redact(
    tenant: Tenant,
    stream_id: str,
    *,
    position: int | None = None,
    record_hash_: str | None = None,
    reason: str,
    actor: Actor,
) -> Redaction:
    """Delete a record's payload and salt (the header, its hash and its leaf stay, so the chain and
    every proof still verify) and record who, when, why and which record in the server stream."""
    reason = (reason or "").strip()
    if not reason:
        raise IngestRefused("invalid", "reason: required", field="reason")
    require_tenant(tenant)
    query = Record.objects.select_related("stream").filter(stream__stream_id=stream_id)
    if position is not None:
        query = query.filter(position=position)
    elif record_hash_ is not None:
        stream = Stream.objects.filter(stream_id=stream_id).first()
        query = query.none() if stream is None else held_by_hash(query, record_hash_, stream=stream)
    else:
        raise IngestRefused("invalid", "position: give the record's position or its hash", field="position")
    record = next(iter(query[:1]), None)
    if record is None:
        raise IngestRefused("not_found", "no such record in this tenant", status=404)
    if record.redacted or Redaction.objects.filter(record=record).exists():
        raise IngestRefused("already_redacted", "this record's payload is already erased", status=409)
    RecordPayload.objects.filter(record=record).delete()
    server_record = append_server_record(
        tenant,
        Event.AUDIT_RECORD_REDACTED,
        {"stream": stream_id, "position": record.position, "record_hash": record.h, "reason": reason},
        actor=actor,
    )
    redaction = Redaction.objects.create(
        tenant=tenant, record=record, reason=reason, actor=stored(actor), server_record=server_record
    )
    hooks.payload_erased(tenant, record)
    return redaction


def stored_record(record: Record, payload: RecordPayload | None, erased_reason: str | None) -> dict[str, Any]:
    """A stored record in WAL form: what the writer sent, or its redacted stub."""
    out = record.header()
    if payload is not None:
        out.update(payload.fields)
        out["_s"] = payload.salt
    else:
        out["_redacted"] = record.sent_redacted or erased_reason or "erased"
    return out
