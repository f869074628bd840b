"""State of the per-tenant transparency log.

Storage choice (why every perfect node, not only tiles): `TreeNode` keeps one row per perfect
subtree at *every* level, keyed (tenant, level, index). That costs ~2n rows for n leaves, and buys:
- an inclusion or consistency proof = one indexed point query for at most ~2·log2(n) keys
  (every proof element is a perfect node or the fold of a few of them), never a leaf scan;
- a C2SP tile `tile/<L>/<N>[.p/<W>]` = one range scan of the W consecutive rows at level 8L,
  already in tile order, so standard tlog clients can compute proofs themselves.
Storing only the level-8L rows (tiles proper) would halve the rows but make every proof hash up
to 256 hashes per element; that trade is the one for object storage past one machine (§6), where
the tile files are written from these rows with `merkle.tiles_for_growth`.

Perfect nodes never change once complete, so rows are insert-only; `TreeState` is the single
mutable row per tenant (size + compact range), locked by the integrator; `SealState` is the
sealer's (its watermark), so the two never wait for each other's lock.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from core.scoping import TenantScopedModel, tenant_field


class KeyStatus(models.TextChoices):
    ACTIVE = "active", "Active (signs every checkpoint)"
    RETIRING = "retiring", "Retiring (co-signs during a rotation)"
    RETIRED = "retired", "Retired (verifies old checkpoints only)"


class LogSigningKey(TenantScopedModel):
    """A tenant's Ed25519 checkpoint key. The seed is only ever stored Fernet-encrypted with the
    master key(s) (`transparency.keys`); the public half is stored in clear for verifier strings."""

    name = models.CharField(max_length=200)  # the log origin: C2SP key name == checkpoint origin
    key_id = models.CharField(max_length=8)  # hex of the 4-byte C2SP key id
    public_key = models.BinaryField(max_length=32)
    encrypted_seed = models.TextField()  # MultiFernet token; never the seed itself
    status = models.CharField(max_length=8, choices=KeyStatus.choices, default=KeyStatus.ACTIVE)
    created_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"], condition=models.Q(status="active"), name="one_active_log_key_per_tenant"
            ),
            models.UniqueConstraint(fields=["tenant", "key_id"], name="log_key_id_unique_per_tenant"),
        ]


class TreeState(TenantScopedModel):
    """The tree as far as it has been integrated: `size` leaves, and its compact range (one
    perfect-subtree hash per set bit of size, largest first, concatenated) so appending needs
    no other read. The integrator holds this row locked while it extends and signs."""

    size = models.BigIntegerField(default=0)
    compact_hashes = models.BinaryField(default=b"")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_tree_state_per_tenant")]


class SealState(TenantScopedModel):
    """The seal watermark, a row of its own so that sealing runs beside integration, not inside it:
    seal passes serialise on this row's lock, the integrator on TreeState's, and
    neither waits for the other (they used to share TreeState's lock, and seals, ~14% of the
    leaves, took ~2/3 of the integrator's time).

    Leaves [0, sealed_size) of the tenant log have been through the seal pass
    (tasks.seal_pending): every saga they finished has a current seal. A crash between
    accepting and sealing leaves it behind the log's size, which is how the beat finds the work
    with one indexed comparison, not a saga scan."""

    sealed_size = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_seal_state_per_tenant")]


class TreeNode(TenantScopedModel):
    """Hash of the perfect subtree covering leaves [index·2^level, (index+1)·2^level)."""

    tenant = tenant_field(db_index=False)  # `one_tree_node_per_position` leads with it

    level = models.PositiveSmallIntegerField()
    index = models.BigIntegerField()
    hash = models.BinaryField(max_length=32)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "level", "index"], name="one_tree_node_per_position")
        ]


class Checkpoint(TenantScopedModel):
    """A signed C2SP checkpoint. Append-only: each is consistent with every earlier one (the
    integrator proves it before signing)."""

    size = models.BigIntegerField()
    root = models.BinaryField(max_length=32)
    note = models.TextField()  # the signed note exactly as served
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["tenant", "-id"], name="checkpoint_latest")]


class ExportStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class Export(TenantScopedModel):
    """A WORM export: a leaf range [first, end) of the log, proven against `checkpoint`."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    status = models.CharField(max_length=8, choices=ExportStatus.choices, default=ExportStatus.QUEUED)
    first = models.BigIntegerField(null=True, blank=True)
    end = models.BigIntegerField(null=True, blank=True)
    since = models.DateTimeField(null=True, blank=True)
    until = models.DateTimeField(null=True, blank=True)
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    previous = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    records_done = models.BigIntegerField(default=0)
    records_total = models.BigIntegerField(default=0)
    storage_name = models.CharField(max_length=300, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)  # of the tar.gz as stored
    requested_by = models.CharField(max_length=200)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Builds claimed so far; a build's writes are fenced on its attempt number, so a worker the
    # sweep gave up on cannot overwrite the state of the attempt that replaced it.
    attempts = models.PositiveIntegerField(default=0)
    # Last sign of life (queued, claimed, a chunk of records written); the sweep re-queues an
    # unfinished export whose heartbeat is older than SAGAPLANE_EXPORT_STALE_MINUTES.
    heartbeat_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="export_stale_sweep")]

    @property
    def progress(self) -> float:
        if self.status == ExportStatus.DONE:
            return 1.0
        return self.records_done / self.records_total if self.records_total else 0.0


class WitnessQuorum(TenantScopedModel):
    """How many of the tenant's witnesses must cosign a checkpoint before it is served as
    witnessed (disclosures, proof bundles, the policy file): 0 until an admin sets it."""

    quorum = models.PositiveSmallIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant"], name="one_witness_quorum_per_tenant")]


class Witness(TenantScopedModel):
    """A C2SP tlog-witness the tenant's checkpoints are sent to (`transparency.cosigning`).

    `cosigned_size` is the size of the latest checkpoint it cosigned for us (the `old` of the next
    request); the cosigning task moves it, and the attempt fields, after each answer."""

    name = models.CharField(max_length=64)  # the policy file's name for it
    url = models.CharField(max_length=500)  # its submission prefix
    vkey = models.TextField()  # C2SP cosigner vkey: Ed25519 (0x04) or ML-DSA-44 (0x06)
    created_at = models.DateTimeField(default=timezone.now)
    cosigned_size = models.BigIntegerField(null=True, blank=True)
    cosigned_checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cosigned_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)  # 0: unreachable
    last_error = models.TextField(blank=True)
    failures = models.PositiveIntegerField(default=0)  # in a row; backs off the next attempt
    next_attempt_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="witness_name_unique_per_tenant")
        ]


class Cosignature(TenantScopedModel):
    """One witness's cosignature line on one checkpoint, verified against its vkey when stored."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="cosignatures")
    witness = models.ForeignKey(Witness, null=True, on_delete=models.SET_NULL, related_name="+")
    witness_name = models.CharField(max_length=64)
    line = models.TextField()  # "— <key name> <base64>\n", as the witness answered
    timestamp = models.BigIntegerField()  # the cosignature's own (signed) time
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "witness"], name="one_cosignature_per_witness")
        ]


class WitnessRefusal(TenantScopedModel):
    """A witness's answer that was not a cosignature: its HTTP status (0: unreachable, or its
    address refused by the outbound guard) and what it said. A 422 from a witness that cosigned
    before means it saw a checkpoint inconsistent with one it cosigned: a split view."""

    witness = models.ForeignKey(Witness, null=True, on_delete=models.SET_NULL, related_name="+")
    witness_name = models.CharField(max_length=64)
    checkpoint = models.ForeignKey(Checkpoint, null=True, on_delete=models.SET_NULL, related_name="+")
    size = models.BigIntegerField()
    status = models.PositiveSmallIntegerField()
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["tenant", "-id"], name="witness_refusal_latest")]
