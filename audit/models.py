"""The evidence store: streams, append-only record headers, erasable payloads, and the per-tenant
leaf counter the transparency log builds on.

Invariants (enforced in `audit.services`, the only writer, and by the database where it can):
- a Stream's records have positions 1..length with no hole; position p+1's `ph` is position p's `h`
  (or, for an attested compaction gap, a hash the server never held);
- `Record` rows are never updated or deleted (a Postgres trigger refuses both); erasure deletes the
  `RecordPayload` row and writes a `Redaction` row, so the header and its `leaf_hash` never change;
- a tenant's `Record.leaf_index` values are exactly 0..TenantLog.size-1, assigned in commit order
  under the TenantLog row lock, so the transparency log can read leaves in order with no gap.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models
from django.db.models import Func, Q
from django.utils import timezone

from core.scoping import TenantScopedModel

GENESIS = "0" * 64
SERVER_STREAM_ID = "server"

# Records are found by hash within blocks of 2**16 consecutive leaves (see `Record.Meta`).
LEAF_BLOCK_BITS = 16


class LeafBlock(Func):
    """The block of 2**LEAF_BLOCK_BITS leaves a leaf index falls in (`Record.leaf_block`)."""

    template = f"(%(expressions)s >> {LEAF_BLOCK_BITS})"
    output_field = models.BigIntegerField()


def leaf_blocks(first: int, last: int) -> list[int]:
    """The blocks that hold leaves first..last (inclusive)."""
    return list(range(first >> LEAF_BLOCK_BITS, (last >> LEAF_BLOCK_BITS) + 1))


class TenantLog(TenantScopedModel):
    """One row per tenant: the number of leaves so far. Locked (SELECT ... FOR UPDATE) by every
    append, so leaf indices are contiguous and committed in index order."""

    size = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_log_per_tenant")]


class StreamKind(models.TextChoices):
    AGENT = "agent", "Agent WAL"
    SERVER = "server", "Server-appended records"


class Stream(TenantScopedModel):
    """One writer's chain. The head is what the next record must link to."""

    stream_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=StreamKind.choices, default=StreamKind.AGENT)
    head_hash = models.CharField(max_length=64, default=GENESIS)
    head_seq = models.BigIntegerField(null=True, blank=True)
    length = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "stream_id"], name="stream_id_per_tenant")]
        indexes = [models.Index(fields=["tenant", "head_hash"], name="audit_stream_head")]

    def __str__(self) -> str:
        return self.stream_id


class Record(TenantScopedModel):
    """A record's chained header. Append-only; see the module docstring."""

    # No index on the tenant alone: the indexes below that lead with it serve any lookup by tenant,
    # and a lone one was a trap: with a fresh tenant's statistics stale (it grew since the last
    # ANALYZE), the planner read the whole tenant through it instead of a leaf range or a saga's
    # records, on every pass of the integrator.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="+", editable=False, db_index=False
    )
    stream = models.ForeignKey(Stream, on_delete=models.PROTECT, related_name="records")
    position = models.BigIntegerField(help_text="1-based place in the stream's chain (not seq)")
    seq = models.BigIntegerField()
    ts = models.FloatField()
    # `ts` exactly as the writer serialised it (1 and 1.0 hash differently); `ts` is for queries.
    ts_json = models.CharField(max_length=40)
    event = models.CharField(max_length=64)
    cd = models.CharField(max_length=64)
    ph = models.CharField(max_length=64)
    h = models.CharField(max_length=64)
    saga_id = models.CharField(max_length=128, blank=True, default="")
    step_id = models.CharField(max_length=128, blank=True, default="")
    tool = models.CharField(max_length=200, blank=True, default="")
    # Set only when the record arrived as a redacted stub; later erasures live in `Redaction`.
    redacted = models.CharField(max_length=200, blank=True, default="")
    # `event`, `saga_id`, `step_id`, `tool` and `redacted` are index copies (`audit.jsonvalues`:
    # NUL, which Postgres text refuses, becomes U+FFFD). When `event` or `redacted` differs from
    # what was sent, this holds the sent values as ASCII JSON ({"event": ..., "_redacted": ...});
    # empty otherwise. (The ids are exact in the payload.)
    verbatim = models.TextField(blank=True, default="")
    received_at = models.DateTimeField(default=timezone.now)
    leaf_index = models.BigIntegerField()
    leaf_hash = models.BinaryField(max_length=32)
    # The block of 2**LEAF_BLOCK_BITS leaves this record is in, computed by the database: the key
    # that gives lookups by hash insert locality (`Meta.indexes`). A column, not an expression
    # index: under row-level security Postgres uses a condition as an index condition only if its
    # functions are leakproof, and `>>` is not, so `(leaf_index >> 16) = ANY(...)` was applied
    # as a filter over every entry of the tenant; `leaf_block = ANY(...)` is plain int8 equality.
    leaf_block = models.GeneratedField(
        expression=LeafBlock("leaf_index"), output_field=models.BigIntegerField(), db_persist=True
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["stream", "position"], name="record_position_per_stream"),
            models.UniqueConstraint(fields=["tenant", "leaf_index"], name="record_leaf_per_tenant"),
        ]
        indexes = [
            # By hash, within a block of leaves: `h` is random, so a btree on (tenant, h) took every
            # insert to a random leaf page of an index that outgrew memory (at 10M records, 1,112
            # blocks read per 1,000 records ingested; docs/SCALING.md). Keyed by the leaf block,
            # a tenant's inserts land only in its newest block's range (~7 MiB), which stays
            # cached at any log size; a lookup by hash (re-sends, agent-saga's attach, redaction
            # by hash: never the path that extends a head) probes each block it searches. The
            # block leads: Postgres (before 17) may take `= ANY(blocks)` on a later column as a
            # filter rather than as probes.
            models.Index(fields=["leaf_block", "tenant", "h"], name="audit_record_hash_in_block"),
            # A stream's first record by hash, for agent-saga's genesis attach: one entry per stream.
            models.Index(fields=["tenant", "h"], condition=Q(position=1), name="audit_record_first_hash"),
            models.Index(fields=["tenant", "tool"], name="audit_record_tool"),
            # A saga's records in leaf order (disclosures, the seal pass). Led by the tenant: on
            # saga_id alone every tenant's "saga-1" shared one index range, and the planner would
            # rather scan the whole tenant than probe it for a list of saga ids.
            models.Index(fields=["tenant", "saga_id", "leaf_index"], name="audit_record_saga"),
        ]

    @property
    def ts_value(self) -> Any:
        return json.loads(self.ts_json)

    @property
    def sent_redacted(self) -> str:
        """The `_redacted` reason the record arrived with, exactly ("" when it arrived whole)."""
        if self.verbatim:
            return str(json.loads(self.verbatim).get("_redacted", self.redacted))
        return self.redacted

    def header(self) -> dict[str, Any]:
        """The record's chain fields exactly as the writer sent them."""
        exact = json.loads(self.verbatim) if self.verbatim else {}
        out: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts_value,
            "event": exact.get("event", self.event),
            "_cd": self.cd,
            "_ph": self.ph,
            "_h": self.h,
        }
        return out


class RecordPayload(TenantScopedModel):
    """Business fields and salt: the part erasure deletes. Kept as JSON text (not jsonb) so the
    values come back bit-identical and the content digest keeps verifying."""

    record = models.OneToOneField(Record, on_delete=models.PROTECT, primary_key=True, related_name="payload")
    fields_json = models.TextField()
    salt = models.CharField(max_length=128)

    @property
    def fields(self) -> dict[str, Any]:
        return json.loads(self.fields_json)


class PendingServerRecord(TenantScopedModel):
    """A server-stream record accepted with the change it records (same transaction) but not
    chained yet: the outbox of `audit.services.queue_server_records`. Whoever next holds the
    tenant's server stream appends every pending row, oldest first, and deletes them in the same
    transaction, so each is chained exactly once; until then nothing is lost, only not yet in the
    chain (the recovery sweep appends any left behind)."""

    id = models.BigAutoField(primary_key=True)  # the order they are chained in
    event = models.CharField(max_length=64)
    fields_json = models.TextField(help_text="the business fields with the actor, as chained")
    ts = models.FloatField(help_text="when it was accepted (the server's clock): the record's ts")


class Redaction(TenantScopedModel):
    """An erasure after ingest: who, when, why. The server-stream record of the act is `server_record`."""

    record = models.OneToOneField(Record, on_delete=models.PROTECT, related_name="redaction")
    reason = models.CharField(max_length=500)
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    server_record = models.ForeignKey(Record, on_delete=models.PROTECT, related_name="+", null=True)


class RefusedBatch(TenantScopedModel):
    """A batch refused for its chain (422) or for equivocation (409): none of its records were
    stored, but the refusal itself is kept, so the evidence page can show a stream's troubles."""

    stream_id = models.CharField(max_length=200)
    status = models.PositiveSmallIntegerField()
    code = models.CharField(max_length=40)
    seq = models.CharField(max_length=40, blank=True)
    index = models.IntegerField(null=True)
    detail = models.TextField()
    record_count = models.PositiveIntegerField()
    actor = models.CharField(max_length=200)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["tenant", "stream_id", "-received_at"])]


class EquivocationAttempt(TenantScopedModel):
    """Evidence of a refused record that claimed a position the stream already holds."""

    stream_id = models.CharField(max_length=200)
    position = models.BigIntegerField()
    held_hash = models.CharField(max_length=64)
    offered_hash = models.CharField(max_length=64)
    offered_record = models.TextField()
    actor = models.CharField(max_length=200)
    received_at = models.DateTimeField(default=timezone.now)
