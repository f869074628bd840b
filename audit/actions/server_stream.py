"""The tenant's own server stream: records of admin actions, approvals, recovery and redactions,
appended in the caller's transaction (`append_server_record(s)`) or accepted with it and chained
in batches after its commit (`queue_server_records`, group commit by time).

Every function here asserts the tenant's scope (`core.scoping.require_tenant`): the transport
that carries the work entered it. What runs after a commit (the re-check that chains what was
left pending) and the sweeps' chaining are units of work of their own, entered per batch by
`audit.tasks.chain_pending_server_records` (a transport)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from sagaplane.chain import stamp

from audit.actions.common import IngestResult
from audit.actions.parsing import parse_batch
from audit.actions.storage import lock_stream, store_planned
from audit.actions.verification import Plan
from audit.models import SERVER_STREAM_ID, PendingServerRecord, Record, Stream, StreamKind
from core import timing
from core.actors import Actor, stored
from core.postcommit import after_commit
from core.scoping import require_tenant
from tenants.models import Tenant


def append_server_record(tenant: Tenant, event: str, fields: dict[str, Any], *, actor: Actor) -> Record:
    """Append a chained record to the tenant's server stream, in the caller's transaction (so the
    audit record commits or rolls back with the change it records)."""
    return append_server_records(tenant, [(event, fields)], actor=actor).records[0]


def append_server_records(
    tenant: Tenant, entries: Sequence[tuple[str, dict[str, Any]]], *, actor: Actor
) -> IngestResult:
    """Append several chained records (event, fields) to the tenant's server stream as one batch,
    in the caller's transaction: one stream lock, one walk, one set-based store (the integrator's
    seal pass writes thousands of seals at once under sustained ingest). Records still pending
    (`queue_server_records`) are chained first, in the same batch, so the stream keeps the order
    in which their changes committed. The result names the caller's records only. A savepoint of
    its own: a failed append leaves nothing half-done in a caller that catches it."""
    require_tenant(tenant)
    now, who = time.time(), stored(actor)
    with transaction.atomic():
        with timing.phase("stream_lock"):  # waiting for the tenant's server stream included
            stream = lock_stream(tenant, SERVER_STREAM_ID, StreamKind.SERVER)
        result, _ = _chain_after_pending(
            tenant, stream, [(str(event), _business(fields, who), now) for event, fields in entries]
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
    tenant: Tenant, entries: Sequence[tuple[str, dict[str, Any]]], *, actor: Actor
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
    require_tenant(tenant)
    now, who = time.time(), stored(actor)
    PendingServerRecord.objects.bulk_create(
        [
            PendingServerRecord(
                tenant=tenant, event=str(event), fields_json=json.dumps(_business(fields, who)), ts=now
            )
            for event, fields in entries
        ]
    )
    _recheck_after_commit(tenant, window=settings.EVIDENCE_GROUP_WINDOW_S)


FLUSH_BATCH = 2000  # pending rows chained per transaction
FLUSH_ROUNDS = 10
# A holder's re-checks after its commit: each chains everything pending so far, and a request must
# not turn into the tenant's flusher for as long as results keep coming. What arrives after the
# last one is chained by the next result, or by the sweep within a second.
RECHECK_ROUNDS = 2


def flush_server_records(
    tenant: Tenant, *, wait: bool = False, rounds: int = FLUSH_ROUNDS, before: float | None = None
) -> int:
    """In the caller's scope (a reader that must count every accepted result: the certificate):
    chain the tenant's pending server records, FLUSH_BATCH per savepoint, until none is left or
    (unless `wait`) someone else holds the stream: its own re-check will chain them. With
    `before` (a Unix time), only when some row was accepted before it (left behind, not in
    flight: a periodic pass must not queue for the stream behind every result). Returns how many
    this call chained. Outside a scope (a sweep, after a commit), each batch a transaction of its
    own as the tenant: `audit.tasks.chain_pending_server_records`."""
    require_tenant(tenant)
    done = 0
    for _ in range(rounds):
        if not server_records_pending(tenant, before):
            break
        with transaction.atomic():  # a savepoint per batch, as a nested scope took
            chained = chain_pending_batch(tenant, wait=wait)
        if not chained:
            break
        done += chained
    return done


def pending_server_records(tenant: Tenant) -> int:
    require_tenant(tenant)
    return PendingServerRecord.objects.count()


def _pending_rows(before: float | None) -> Any:
    pending_rows = PendingServerRecord.objects.all()
    return pending_rows if before is None else pending_rows.filter(ts__lt=before)


def server_records_pending(tenant: Tenant, before: float | None = None) -> bool:
    """Whether any row is pending (accepted before `before`): one statement, which needs no
    transaction around it (every result's re-check after its commit asks, and mostly hears no:
    the transport asks it statement-scoped)."""
    require_tenant(tenant)
    return bool(_pending_rows(before).exists())


def chain_pending_batch(tenant: Tenant, *, wait: bool) -> int:
    """In the caller's transaction (one of its own when statement-scoped; no savepoint: the
    transport's transaction is this batch's): take the server stream (or, unless `wait`, give up
    at once if it is held) and chain the oldest pending rows, at most FLUSH_BATCH; 0 when the
    stream is held or none was left (the caller asked `server_records_pending` first: no lock is
    taken for nothing but in a race)."""
    require_tenant(tenant)
    with transaction.atomic(savepoint=False):
        if wait:
            with timing.phase("stream_lock"):
                stream: Stream | None = lock_stream(tenant, SERVER_STREAM_ID, StreamKind.SERVER)
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
            stream = lock_stream(tenant, SERVER_STREAM_ID, StreamKind.SERVER)  # its first record
    return stream


def _recheck_after_commit(tenant: Tenant, *, window: float | None = None) -> None:
    """Once the caller's transaction commits, chain what is pending (with `window`, only rows
    accepted more than `window` seconds before the re-check: group commit by time). A unit of
    work of its own, entered per batch by the transport `audit.tasks.chain_pending_server_records`."""

    def recheck() -> None:
        from audit.tasks import chain_pending_server_records

        before = None if window is None else time.time() - window
        chain_pending_server_records(tenant, rounds=RECHECK_ROUNDS, before=before)

    after_commit(f"chain pending server records of tenant {tenant.pk}", recheck)


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
    return store_planned(tenant, stream, Plan(planned, 0), actor=actor)
