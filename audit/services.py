"""Every state change of the evidence store. Nothing else writes `audit` tables.

- `ingest(tenant, stream_id, records, actor=...)`: verify a batch against the stream's stored head
  and append it whole, or refuse it whole (`IngestRefused`, store unchanged except for the
  evidence row of an equivocation attempt).
- `ingest_by_linkage(tenant, records, actor=...)`: agent-saga's `/v1/wal/ingest`, whose records name
  no stream: each chain segment is attached where its first record links (ARCHITECTURE §3).
- `append_server_record(tenant, event, fields, actor=...)`: the tenant's own server stream, for
  admin actions, approvals and redactions, in the caller's transaction.
- `redact(tenant, stream_id, ..., reason, actor)`: erasure of a payload, recorded in the server stream.

One chain rule for SDK and server: the hashing and the walk are `sagaplane.chain`'s
(`ChainWalk`, the walk `verify_chain` runs: same reasons, same first bad record); `_plan` adds only
what the server knows, the records it already holds.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from sagaplane.chain import (
    ChainBreak,
    ChainWalk,
    SeqRanges,
    attested_ranges,
    business_fields,
    content_breaks,
    stamp,
)
from sagaplane.events import Event
from sagaplane.leaf import leaf_data
from sagaplane.limits import MAX_NESTING
from sagaplane.merkle import leaf_hash

from audit import bulk, hooks
from audit.jsonvalues import index_text
from audit.models import (
    GENESIS,
    SERVER_STREAM_ID,
    EquivocationAttempt,
    PendingServerRecord,
    Record,
    RecordPayload,
    Redaction,
    RefusedBatch,
    Stream,
    StreamKind,
    TenantLog,
    leaf_blocks,
)
from controlplane import timing
from controlplane.errors import DomainError
from controlplane.numbers import finite_number
from controlplane.postcommit import after_commit
from tenants.models import Tenant
from tenants.scoping import joined_tenant_context, tenant_context, tenant_statements

logger = logging.getLogger(__name__)

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX = re.compile(r"[0-9a-f]+\Z")
STREAM_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,199}\Z")
INDEXED_MAX = {"saga_id": 128, "step_id": 128, "tool": 200}


class IngestRefused(DomainError):
    """A refused batch (or erasure). `code` is the specific reason (digest_mismatch, broken_link,
    seq_gap, equivocation, forged_gap, invalid, ...); `error` the API's top-level error code."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        seq: Any = None,
        index: int | None = None,
        field: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(status, code, detail, **extra)
        self.seq = seq
        self.index = index
        self.field = field

    @property
    def error(self) -> str:
        return "chain_broken" if self.status == 422 else self.code

    def context(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        if self.status in (409, 422):
            out.update(seq=self.seq, index=self.index, reason=self.code)
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass
class IngestResult:
    stream_id: str
    accepted: int
    duplicates: int
    head_seq: int | None
    head_hash: str
    rows: list[bulk.StoredRow] = field(default_factory=list)

    @property
    def records(self) -> list[Record]:
        """The appended headers as model instances (built on demand: the hot path never needs them)."""
        return [row.as_record() for row in self.rows]

    def as_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream_id,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "head": {"seq": self.head_seq, "hash": self.head_hash},
        }


# -- parsing ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Incoming:
    """One batch record, type-checked, with what verification and storage need."""

    raw: dict[str, Any]
    index: int
    seq: int
    ts: Any
    event: str
    cd: str
    ph: str
    h: str
    salt: str | None
    redacted: str
    business: dict[str, Any]


def _bad(index: int, name: str, detail: str) -> IngestRefused:
    where = f"records[{index}].{name}"
    return IngestRefused(400, "invalid", f"{where}: {detail}", field=where, index=index)


def parse_batch(records: Any, *, offset: int = 0) -> list[Incoming]:
    """Type-check a batch. Anything that is not a well-formed record is a 400 naming the field."""
    if not isinstance(records, list):
        raise IngestRefused(400, "invalid", "records: must be a list of record objects", field="records")
    out: list[Incoming] = []
    for i, rec in enumerate(records):
        index = offset + i
        if not isinstance(rec, dict):
            raise IngestRefused(
                400, "invalid", f"records[{index}]: must be an object", field=f"records[{index}]"
            )
        seq = rec.get("seq")
        if type(seq) is not int:
            raise _bad(index, "seq", "missing" if seq is None else "must be an integer")
        if seq < 0 or seq > 2**62:
            raise _bad(index, "seq", "out of range")
        ts = rec.get("ts")
        if not finite_number(ts):
            raise _bad(index, "ts", "missing" if ts is None else "must be a finite number")
        if abs(ts) > 2**53:
            raise _bad(index, "ts", "out of range")
        event = rec.get("event")
        if not isinstance(event, str) or not event or len(event) > 64:
            raise _bad(index, "event", "must be a non-empty string of at most 64 characters")
        cd, ph, h = (_chain_field(rec, index, name) for name in ("_cd", "_ph", "_h"))
        redacted = rec.get("_redacted") or ""
        if not isinstance(redacted, str) or len(redacted) > 200:
            raise _bad(index, "_redacted", "must be a reason string of at most 200 characters")
        salt = rec.get("_s")
        if salt is not None and (not isinstance(salt, str) or not _HEX.match(salt) or len(salt) > 128):
            raise _bad(index, "_s", "must be a hex string")
        if salt is None and not redacted:
            raise _bad(index, "_s", "missing chain field (salt) on a record not marked redacted")
        business = business_fields(rec)
        for name, limit in INDEXED_MAX.items():
            value = business.get(name)
            if value is not None and (not isinstance(value, str) or len(value) > limit):
                raise _bad(index, name, f"must be a string of at most {limit} characters")
        for name, value in rec.items():
            problem = _unstorable(name, value)
            if problem is not None:
                # The name as a Python literal: it may be the very text that cannot be encoded.
                where = f"records[{index}]"
                raise IngestRefused(400, problem[0], f"{where} field {name!r}: {problem[1]}", field=where)
        out.append(Incoming(rec, index, seq, ts, event, cd, ph, h, salt, redacted, business))
    return out


def _chain_field(rec: dict[str, Any], index: int, name: str) -> str:
    """A record's chain field `name` (_cd, _ph or _h): 64 lowercase hex characters."""
    value = rec.get(name)
    if value is None:
        raise _bad(index, name, "missing chain field")
    if not isinstance(value, str) or not _HEX64.match(value):
        raise _bad(index, name, "must be 64 lowercase hex characters")
    return value


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _unstorable(name: str, value: Any) -> tuple[str, str] | None:
    """Why a record's field (name, value) can be neither verified nor stored, or None.

    Lone surrogates (JSON "\\ud800"): the chain hashes UTF-8, which cannot encode them, so no
    writer can have chained one (agent-saga and the SDK both fail to write it). Nesting past
    `MAX_NESTING` (the record is level 1): the SDK refuses to write it, and readers recurse."""
    pending: list[tuple[Any, int]] = [(name, 1), (value, 2)]
    while pending:
        item, level = pending.pop()
        if type(item) is str:
            if not item.isascii() and _LONE_SURROGATE.search(item):
                return "unencodable", "holds a lone surrogate (not UTF-8, so no chain can hash it)"
        elif isinstance(item, dict | list):
            if level > MAX_NESTING:
                return "too_deep", f"nests deeper than {MAX_NESTING} levels (the record is level 1)"
            if isinstance(item, dict):
                pending.extend((key, level) for key in item)
                pending.extend((child, level + 1) for child in item.values())
            else:
                pending.extend((child, level + 1) for child in item)
    return None


def validate_stream_id(stream_id: str) -> None:
    if not STREAM_ID_RE.match(stream_id or ""):
        raise IngestRefused(
            400, "invalid", "stream: 1-200 characters of letters, digits and ._:- ", field="stream"
        )


# -- verification ----------------------------------------------------------------------------------


def _chain_error(rec: Incoming, code: str, detail: str, status: int = 422, **extra: Any) -> IngestRefused:
    return IngestRefused(
        status, code, f"record #{rec.index} (seq={rec.seq}): {detail}", seq=rec.seq, index=rec.index, **extra
    )


@dataclass(slots=True)
class _Plan:
    new: list[tuple[Incoming, int]]  # (record, position)
    duplicates: int


class _Held:
    """What the stream already holds, read only when a batch does not just extend the head (most
    never need it): a record by hash (`get`: the index by leaf block, over the stream's own leaves)
    and hashes by position (`hash_at`: one range of the stream's positions, as many as the batch
    can cover). Both are in the append order or bounded by the blocks searched; nothing the
    path that extends a head pays for."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._found: dict[str, tuple[int, int] | None] = {}
        self._hashes: dict[int, str] = {}

    def get(self, h: str) -> tuple[int, int] | None:
        """(position, seq) of the held record hashed `h`, or None."""
        if h not in self._found:
            rows = held_by_hash(Record.objects.filter(stream=self.stream), h, stream=self.stream)
            self._found[h] = next(iter(rows.values_list("position", "seq")[:1]), None)
        return self._found[h]

    def hash_at(self, position: int, ahead: int = 0) -> str:
        """The hash of the held record at `position` ("" when none); on a miss the `ahead`
        positions after it are read too (a re-sent batch walks held positions one by one)."""
        if position not in self._hashes:
            reach = range(position, position + 1 + ahead)
            self._hashes.update(dict.fromkeys(reach, ""))
            self._hashes.update(
                Record.objects.filter(
                    stream=self.stream, position__gte=reach.start, position__lt=reach.stop
                ).values_list("position", "h")
            )
        return self._hashes[position]


def held_by_hash(records: QuerySet[Record], h: str, *, stream: Stream | None = None) -> QuerySet[Record]:
    """`records` narrowed to those hashed `h` among the leaves of `stream` (None: the whole log),
    through the (leaf block, tenant, h) index: one probe per block of 65,536 leaves searched."""
    if stream is None:
        size = TenantLog.objects.values_list("size", flat=True).first() or 0
        first, last = 0, size - 1
    elif stream.length:
        ends = Record.objects.filter(stream=stream, position__in=[1, stream.length]).values_list(
            "leaf_index", flat=True
        )
        # A stream's leaves grow with its positions: its first and last record bound them.
        first, last = min(ends, default=0), max(ends, default=-1)
    else:
        first, last = 0, -1
    if last < first:
        return records.none()
    return records.filter(leaf_block__in=leaf_blocks(first, last), h=h)


def _plan(stream: Stream, batch: Sequence[Incoming]) -> _Plan:
    """Walk the batch from the stored head with `sagaplane.chain.ChainWalk` (the SDK verifier's
    walk: same rules, same first bad record, same reason) and raise on the first break. What only
    the server knows is layered on top: records it already holds (a re-send is counted as
    duplicates; a different record at a held position is equivocation) and attested gaps, which
    may only cover records it never received."""
    held = _Held(stream)
    attested = attested_ranges(r.raw for r in batch)
    walk = ChainWalk(attested, head=stream.head_hash, head_seq=stream.head_seq, strict=True)
    pos = stream.length  # position of `walk.prev` (0 = before the first record)
    new: list[tuple[Incoming, int]] = []
    duplicates = 0
    for i, rec in enumerate(batch):
        at_head = pos == stream.length + len(new)
        resent = held.get(rec.h) if i == 0 and rec.ph != walk.prev else None
        if resent is not None or (not at_head and rec.ph == walk.prev):
            # A re-send of what is held: its own digest and hash prove it is the held record.
            own = content_breaks(rec.raw, rec.index)
            if own:
                raise _refusal(stream, rec, own[0], held, attested)
            if resent is None and held.hash_at(pos + 1, ahead=len(batch) - i) != rec.h:
                # prev is a held record inside the stream: the next one must be the held one too.
                raise _equivocation(stream, rec, pos + 1, held.hash_at(pos + 1))
            duplicates += 1
            pos = resent[0] if resent is not None else pos + 1
            walk.move_to(rec.h, rec.seq)
            continue
        prev = walk.prev
        breaks = walk.step(rec.index, rec.raw)
        if breaks:
            raise _refusal(stream, rec, breaks[0], held, attested)
        # An attested compaction gap: the predecessor was never shipped. Only at the head, and never
        # over a record the server holds.
        skipped = walk.gap_forgiven and rec.ph != prev
        if skipped and (not at_head or _held_position(stream, held, rec.ph) is not None):
            raise _forged_gap(rec)
        pos += 1
        new.append((rec, pos))
    return _Plan(new, duplicates)


def _held_position(stream: Stream, held: _Held, h: str) -> int | None:
    """Where the stream holds the record hashed `h` (0: genesis, for a stream that has records)."""
    if h == GENESIS:
        return 0 if stream.length > 0 else None
    spot = held.get(h)
    return None if spot is None else spot[0]


def _refusal(
    stream: Stream, rec: Incoming, brk: ChainBreak, held: _Held, attested: SeqRanges
) -> IngestRefused:
    """The walk's first break as the API's refusal. A broken link that claims a predecessor the
    server holds is named for what it is: a fork of held history (equivocation), or, when the
    batch attests a gap, an attempt to attest away held records (forged_gap)."""
    # A record that links to a held record other than the head forks held history, whichever
    # rule the walk tripped first (racing extensions of one head fail the seq check first).
    if brk.code in ("broken_link", "seq_regression", "seq_gap") and held.get(rec.h) is None:
        claimed = _held_position(stream, held, rec.ph)
        if claimed is not None:
            if attested:
                return _forged_gap(rec)
            if claimed < stream.length:
                return _equivocation(stream, rec, claimed + 1, held.hash_at(claimed + 1))
    extra: dict[str, Any] = {}
    if brk.code == "broken_link":
        extra = {"expected": brk.expected, "found": brk.found}
    return IngestRefused(422, brk.code, str(brk), seq=brk.seq, index=brk.index, **extra)


def _forged_gap(rec: Incoming) -> IngestRefused:
    return _chain_error(
        rec, "forged_gap", "a WAL_CHAIN_GAP attestation cannot remove records the server already holds"
    )


def _equivocation(stream: Stream, rec: Incoming, position: int, held_hash: str) -> IngestRefused:
    return _chain_error(
        rec,
        "equivocation",
        f"stream position {position} already holds a different record",
        status=409,
        stream=stream.stream_id,
        position=position,
        held_hash=held_hash,
        offered_hash=rec.h,
    )


# -- storage ---------------------------------------------------------------------------------------


def _lock_stream(tenant: Tenant, stream_id: str, kind: str) -> Stream:
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
            403, "reserved_stream", f"stream '{stream_id}' is written by the server only", field="stream"
        )
    return stream


def _lock_log(tenant: Tenant) -> TenantLog:
    log = TenantLog.objects.select_for_update().first()
    if log is None:
        TenantLog.objects.bulk_create([TenantLog(tenant=tenant)], ignore_conflicts=True)
        log = TenantLog.objects.select_for_update().get()
    return log


def _verbatim(rec: Incoming) -> str:
    """Record.verbatim: the header text a column could not hold as sent (see the model)."""
    sent = {"event": rec.event, "_redacted": rec.redacted}
    if all("\x00" not in value for value in sent.values()):
        return ""
    return json.dumps({name: value for name, value in sent.items() if value})


def _store(tenant: Tenant, stream: Stream, plan: _Plan, *, actor: str) -> list[bulk.StoredRow]:
    """Append the planned records: leaf indices under the tenant log lock, headers then payloads,
    the stream head, and what the subscribers of `audit.hooks` do with them (the saga projection
    in the transaction; the live event and the integration request after commit).

    Everything that needs no lock (leaf hashes, payload JSON) is computed before the tenant log is
    locked, so the section that serialises a tenant's ingests is a few set-based statements."""
    now = timezone.now()
    stream_name = stream.stream_id
    with timing.phase("rows"):  # leaf hashes, payload JSON: no lock, no statement
        rows = [
            bulk.StoredRow(
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
        bulk.prepare_records(rows)
    with timing.phase("projection_fold"):
        on_stored = hooks.records_appending(appended)
    if bulk.is_postgres():
        with timing.phase("log_lock"):  # the tenant's appends serialise here (gapless leaf indices)
            bulk.wait_for_log(tenant.pk)
    with timing.phase("insert_locked"):
        base = _append(tenant, stream, now, rows, plan)
    with timing.phase("projection_write"):
        hooks.records_stored(appended, on_stored, base)
    return rows


def _append(tenant: Tenant, stream: Stream, now: Any, rows: list[bulk.StoredRow], plan: _Plan) -> int:
    """Under the tenant log lock: leaf indices, headers, payloads, the stream head; returns the
    first leaf index."""
    base = bulk.lock_and_append(tenant.pk, stream, now, rows) if bulk.is_postgres() else None
    if base is None and bulk.is_postgres():
        _lock_log(tenant)  # the tenant's first records: create its log row
        base = bulk.lock_and_append(tenant.pk, stream, now, rows)
    if base is None:
        log = _lock_log(tenant)
        base = log.size
        bulk.insert_records(tenant.pk, stream.pk, base, now, rows)
        last_rec, last_pos = plan.new[-1]
        Stream.objects.filter(pk=stream.pk).update(
            head_hash=last_rec.h, head_seq=last_rec.seq, length=last_pos, updated_at=now
        )
        stream.head_hash, stream.head_seq, stream.length = last_rec.h, last_rec.seq, last_pos
        TenantLog.objects.filter(pk=log.pk).update(size=base + len(rows))
    return base


def _ingest_into(tenant: Tenant, stream: Stream, batch: list[Incoming], *, actor: str) -> IngestResult:
    with timing.phase("verify"):
        plan = _plan(stream, batch)
    return _store_planned(tenant, stream, plan, actor=actor)


def _store_planned(tenant: Tenant, stream: Stream, plan: _Plan, *, actor: str) -> IngestResult:
    stored = _store(tenant, stream, plan, actor=actor) if plan.new else []
    return IngestResult(
        stream.stream_id, len(plan.new), plan.duplicates, stream.head_seq, stream.head_hash, stored
    )


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


def ingest(tenant: Tenant, stream_id: str, records: Any, *, actor: str) -> IngestResult:
    """Verify `records` against stream `stream_id`'s head and append them, all or nothing.

    Raises IngestRefused: 400 malformed (field named), 403 reserved stream, 409 equivocation (an
    EquivocationAttempt row is kept), 422 chain broken (seq, index, reason)."""
    validate_stream_id(stream_id)
    with timing.phase("parse"):
        batch = parse_batch(records)
    refused: IngestRefused | None = None
    with tenant_context(tenant):
        try:
            with transaction.atomic():
                stream = _lock_stream(tenant, stream_id, StreamKind.AGENT)
                return _ingest_into(tenant, stream, batch, actor=actor)
        except IngestRefused as exc:
            if exc.status not in KEPT_REFUSALS:
                raise
            # The batch is rolled back (savepoint), the evidence of the attempt is not.
            _keep_evidence(tenant, exc, batch, actor, stream_id)
            refused = exc
    raise refused


def compat_stream_name(first_hash: str) -> str:
    return f"as-{first_hash[:16]}"


def ingest_by_linkage(tenant: Tenant, records: Any, *, actor: str) -> list[IngestResult]:
    """agent-saga's push: records name no stream. A genesis record opens stream `as-<_h[:16]>`;
    the batch's first record, when not genesis, extends the stream whose head (or held record)
    it links to; everything else must chain on within the batch. All segments or none."""
    batch = parse_batch(records)
    segments: list[list[Incoming]] = []
    for rec in batch:
        if not segments or rec.ph == GENESIS:
            segments.append([rec])
        else:
            segments[-1].append(rec)
    refused: IngestRefused | None = None
    results: list[IngestResult] = []
    with tenant_context(tenant):
        try:
            with transaction.atomic():
                for segment in segments:
                    stream_id = _attach(segment[0])
                    stream = _lock_stream(tenant, stream_id, StreamKind.AGENT)
                    results.append(_ingest_into(tenant, stream, segment, actor=actor))
                return results
        except IngestRefused as exc:
            if exc.status not in KEPT_REFUSALS:
                raise
            _keep_evidence(tenant, exc, batch, actor, "agent-saga push")
            refused = exc
    raise refused


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


def append_server_record(tenant: Tenant, event: str, fields: dict[str, Any], *, actor: str) -> Record:
    """Append a chained record to the tenant's server stream, in the caller's transaction (so the
    audit record commits or rolls back with the change it records)."""
    return append_server_records(tenant, [(event, fields)], actor=actor).records[0]


def append_server_records(
    tenant: Tenant, entries: Sequence[tuple[str, dict[str, Any]]], *, actor: str
) -> IngestResult:
    """Append several chained records (event, fields) to the tenant's server stream as one batch,
    in the caller's transaction: one stream lock, one walk, one set-based store (the integrator's
    seal pass writes thousands of seals at once under sustained ingest). Records still pending
    (`queue_server_records`) are chained first, in the same batch, so the stream keeps the order
    in which their changes committed. The result names the caller's records only."""
    now = time.time()
    with tenant_context(tenant):
        with timing.phase("stream_lock"):  # waiting for the tenant's server stream included
            stream = _lock_stream(tenant, SERVER_STREAM_ID, StreamKind.SERVER)
        result, _ = _chain_after_pending(
            tenant, stream, [(str(event), _business(fields, actor), now) for event, fields in entries]
        )
    _recheck_after_commit(tenant)
    return result


def _chain_after_pending(
    tenant: Tenant,
    stream: Stream,
    own: list[tuple[str, dict[str, Any], float]],
    *,
    limit: int | None = None,
) -> tuple[IngestResult, int]:
    """On the locked server stream: the pending rows (oldest first, at most `limit`; deleted as
    they are chained), then `own`. The result names `own` only; beside it, how many pending rows
    were chained."""
    pending = list(PendingServerRecord.objects.order_by("id")[:limit])
    result = _chain_onto(tenant, stream, [_entry(row) for row in pending] + own, actor="")
    if pending:
        PendingServerRecord.objects.filter(pk__in=[row.pk for row in pending]).delete()
        result.rows = result.rows[len(pending) :]
        result.accepted -= len(pending)
    return result, len(pending)


def queue_server_records(
    tenant: Tenant, entries: Sequence[tuple[str, dict[str, Any]]], *, actor: str
) -> None:
    """Accept server-stream records with the caller's change (same transaction) and chain them in
    batches: group commit by time. They are written as `PendingServerRecord` rows (one INSERT);
    once the caller's transaction has committed, a pending row older than
    `settings.EVIDENCE_GROUP_WINDOW_S` (0.2 s; 0 in embedded mode) makes it
    chain everything pending, in one append for every record of the window. Chaining each
    record with its own change cost a whole append (nine statements, and a serialised section
    under the server stream's lock) per record, which is what a recovery worker reporting one
    result per request paid per job.

    What the last records of a burst leave pending is chained by the recovery sweep (every
    second, rows pending EVIDENCE_STALE_S), and readers that must count every accepted result
    (reconciliation, the certificate) flush first. Each row is chained exactly once (its row is
    deleted in the transaction that chains it), oldest first."""
    if not entries:
        return
    now = time.time()
    with joined_tenant_context(tenant):
        PendingServerRecord.objects.bulk_create(
            [
                PendingServerRecord(
                    tenant=tenant, event=str(event), fields_json=json.dumps(_business(fields, actor)), ts=now
                )
                for event, fields in entries
            ]
        )
    after_commit(
        f"chain pending server records of tenant {tenant.pk}",
        lambda: flush_server_records(
            tenant, rounds=RECHECK_ROUNDS, before=time.time() - settings.EVIDENCE_GROUP_WINDOW_S
        ),
    )


FLUSH_BATCH = 2000  # pending rows chained per transaction
FLUSH_ROUNDS = 10
# A holder's re-checks after its commit: each chains everything pending so far, and a request must
# not turn into the tenant's flusher for as long as results keep coming. What arrives after the
# last one is chained by the next result, or by the sweep within a second.
RECHECK_ROUNDS = 2


def flush_server_records(
    tenant: Tenant, *, wait: bool = False, rounds: int = FLUSH_ROUNDS, before: float | None = None
) -> int:
    """Chain the tenant's pending server records, FLUSH_BATCH per transaction, until none is left
    or (unless `wait`) someone else holds the stream: its own re-check will chain them. With
    `before` (a Unix time), only when some row was accepted before it (left behind, not in
    flight: a periodic pass must not queue for the stream behind every result). Returns how many
    this call chained."""
    done = 0
    for _ in range(rounds):
        if not _any_pending(tenant, before):
            break
        with tenant_context(tenant):
            chained = _flush_pending(tenant, wait=wait)
        if not chained:
            break
        done += chained
    return done


def pending_server_records(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return PendingServerRecord.objects.count()


def _pending_rows(before: float | None) -> Any:
    pending_rows = PendingServerRecord.objects.all()
    return pending_rows if before is None else pending_rows.filter(ts__lt=before)


def _any_pending(tenant: Tenant, before: float | None) -> bool:
    """Whether any row is pending (accepted before `before`): one statement with no transaction
    around it on Postgres (every result's re-check after its commit asks, and mostly hears no)."""
    with tenant_statements(tenant):
        return bool(_pending_rows(before).exists())


def _flush_pending(tenant: Tenant, *, wait: bool) -> int:
    """In the caller's transaction: take the server stream (or, unless `wait`, give up at once if
    it is held) and chain the oldest pending rows; 0 when the stream is held or none was left
    (the caller asked `_any_pending` first: no lock is taken for nothing but in a race)."""
    if wait:
        with timing.phase("stream_lock"):
            stream: Stream | None = _lock_stream(tenant, SERVER_STREAM_ID, StreamKind.SERVER)
    else:
        stream = _try_lock_server_stream(tenant)
    if stream is None:  # held: the holder re-checks once it commits
        return 0
    return _chain_after_pending(tenant, stream, [], limit=FLUSH_BATCH)[1]


def _try_lock_server_stream(tenant: Tenant) -> Stream | None:
    """The server stream, locked, or None at once if someone holds it (SKIP LOCKED)."""
    with timing.phase("stream_lock"):
        held = Stream.objects.select_for_update(skip_locked=True)
        stream = held.filter(stream_id=SERVER_STREAM_ID, kind=StreamKind.SERVER).first()
        if stream is None and not Stream.objects.filter(stream_id=SERVER_STREAM_ID).exists():
            stream = _lock_stream(tenant, SERVER_STREAM_ID, StreamKind.SERVER)  # its first record
    return stream


def _recheck_after_commit(tenant: Tenant) -> None:
    after_commit(
        f"chain pending server records of tenant {tenant.pk}",
        lambda: flush_server_records(tenant, rounds=RECHECK_ROUNDS),
    )


def _business(fields: dict[str, Any], actor: str) -> dict[str, Any]:
    # Normalised through JSON: what is hashed must be exactly what is stored and re-read.
    business: dict[str, Any] = json.loads(json.dumps({**fields, "actor": actor}, default=str))
    return business


def _entry(row: PendingServerRecord) -> tuple[str, dict[str, Any], float]:
    return row.event, json.loads(row.fields_json), row.ts


def _chain_onto(
    tenant: Tenant, stream: Stream, entries: Sequence[tuple[str, dict[str, Any], float]], *, actor: str
) -> IngestResult:
    """Chain (event, business fields, ts) onto the locked server stream's head and store them.

    Type-checked like any batch (`parse_batch`), but not walked: they are chained here onto the
    head of the stream the caller has locked, which is all the walk would re-verify, record by
    record (a content digest each; thousands per seal pass under sustained ingest)."""
    head, seq = stream.head_hash, stream.head_seq or 0
    batch: list[dict[str, Any]] = []
    for event, business, ts in entries:
        seq += 1
        record: dict[str, Any] = {"seq": seq, "ts": ts, "event": event, **business}
        head = stamp(record, head)
        batch.append(record)
    planned = [(rec, stream.length + offset) for offset, rec in enumerate(parse_batch(batch), 1)]
    return _store_planned(tenant, stream, _Plan(planned, 0), actor=actor)


# -- erasure ---------------------------------------------------------------------------------------


def redact(
    tenant: Tenant,
    stream_id: str,
    *,
    position: int | None = None,
    record_hash_: str | None = None,
    reason: str,
    actor: str,
) -> Redaction:
    """Delete a record's payload and salt (the header, its hash and its leaf stay, so the chain and
    every proof still verify) and record who, when, why and which record in the server stream."""
    reason = (reason or "").strip()
    if not reason:
        raise IngestRefused(400, "invalid", "reason: required", field="reason")
    with tenant_context(tenant):
        query = Record.objects.select_related("stream").filter(stream__stream_id=stream_id)
        if position is not None:
            query = query.filter(position=position)
        elif record_hash_ is not None:
            stream = Stream.objects.filter(stream_id=stream_id).first()
            query = query.none() if stream is None else held_by_hash(query, record_hash_, stream=stream)
        else:
            raise IngestRefused(
                400, "invalid", "position: give the record's position or its hash", field="position"
            )
        record = next(iter(query[:1]), None)
        if record is None:
            raise IngestRefused(404, "not_found", "no such record in this tenant")
        if record.redacted or Redaction.objects.filter(record=record).exists():
            raise IngestRefused(409, "already_redacted", "this record's payload is already erased")
        RecordPayload.objects.filter(record=record).delete()
        server_record = append_server_record(
            tenant,
            Event.AUDIT_RECORD_REDACTED,
            {"stream": stream_id, "position": record.position, "record_hash": record.h, "reason": reason},
            actor=actor,
        )
        redaction = Redaction.objects.create(
            tenant=tenant, record=record, reason=reason, actor=actor, server_record=server_record
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
