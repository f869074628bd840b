"""Every state change of the transparency log; each is one function and one transaction.

The invariant they protect: no two signed checkpoints of a tenant are inconsistent. `integrate`
proves consistency with the last signed checkpoint (re-reading that checkpoint from its signed
note, not from a column) with `merkle.verify_consistency` *before* it signs, under a row lock on
`TreeState`; any disagreement between stored state, stored nodes and the last note refuses.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from sagaplane import merkle, note
from sagaplane.events import Event

from audit.jsonvalues import index_text
from audit.services import append_server_record
from controlplane import timing
from controlplane.errors import DomainError
from controlplane.postcommit import after_commit
from tenants.models import Tenant
from tenants.scoping import tenant_context
from transparency import cross_tenant, keys, sources, treestore, witnesses
from transparency.models import (
    Checkpoint,
    Export,
    ExportStatus,
    KeyStatus,
    LogSigningKey,
    SealState,
    TreeState,
)
from transparency.proofs import StoredNodes

log = logging.getLogger(__name__)

SEAL_EVENT = sources.SEAL_EVENT
# One integration appends at most settings.SAGAPLANE_INTEGRATION_CHUNK_LEAVES leaves, so a
# backlog is worked off in bounded transactions (each still signs a checkpoint) instead of one
# lock held for minutes, and a worker asked to stop can stop between two.


class IntegrationRefused(DomainError):
    """The integrator found stored state it cannot extend consistently; nothing was signed.
    The server's fault, never the client's (a 500 should one reach an API answer)."""

    def __init__(self, detail: str) -> None:
        super().__init__(500, "integration_refused", detail)


# --------------------------------------------------------------------------- keys


def _create_key(tenant: Tenant, status: str) -> LogSigningKey:
    signer = note.generate_signer(keys.log_origin(tenant))
    return LogSigningKey.objects.create(
        tenant=tenant,
        name=signer.name,
        key_id=signer.key_id.hex(),
        public_key=signer.public_key,
        encrypted_seed=keys.encrypt_seed(signer.seed),
        status=status,
    )


def _active_key(tenant: Tenant) -> LogSigningKey:
    key = LogSigningKey.objects.filter(status=KeyStatus.ACTIVE).first()
    return key if key is not None else _create_key(tenant, KeyStatus.ACTIVE)


def ensure_signing_key(tenant: Tenant) -> LogSigningKey:
    """The tenant's active log key, created on first use."""
    with tenant_context(tenant):
        return _active_key(tenant)


def _signers() -> list[note.Signer]:
    # Active first, then any key being rotated out: during a rotation each note carries both
    # signatures, so clients pinned to either key keep verifying.
    rows = sorted(
        LogSigningKey.objects.exclude(status=KeyStatus.RETIRED), key=lambda k: k.status != KeyStatus.ACTIVE
    )
    return [keys.signer_from(row.name, row.encrypted_seed) for row in rows]


def verifiers(include_retired: bool = True) -> list[note.Verifier]:
    rows = LogSigningKey.objects.order_by("id")
    if not include_retired:
        rows = rows.exclude(status=KeyStatus.RETIRED)
    return [note.Verifier.from_public_key(row.name, bytes(row.public_key)) for row in rows]


def sign_statement(tenant: Tenant, text: str) -> str:
    """`text` as a C2SP signed note by the tenant's log keys (active first, then any key being
    rotated out), so it verifies offline against the same verifier keys as the checkpoints. A
    tenant has keys once the integrator signed its first checkpoint; before that, 404."""
    with tenant_context(tenant):
        signers = _signers()
    if not signers:
        raise DomainError(
            404, "no_signing_key", "the log has no signing key yet (none before its first checkpoint)"
        )
    return note.sign_note(text, signers)


def log_origin(tenant: Tenant) -> str:
    """The tenant log's origin, which is also its keys' name."""
    return keys.log_origin(tenant)


def current_verifier_keys(include_retired: bool = False) -> list[str]:
    """Verifier key strings, active first (what `GET /api/v1/audit/key` serves)."""
    order: dict[str, int] = {KeyStatus.ACTIVE: 0, KeyStatus.RETIRING: 1, KeyStatus.RETIRED: 2}
    rows = sorted(LogSigningKey.objects.all(), key=lambda k: (order[k.status], -k.pk))
    return [
        note.Verifier.from_public_key(row.name, bytes(row.public_key)).encode()
        for row in rows
        if include_retired or row.status != KeyStatus.RETIRED
    ]


def rotate_signing_key(tenant: Tenant, *, actor: str) -> LogSigningKey:
    """A new active key; the old one co-signs ("retiring") until `finish_key_rotation`. The
    current tree is re-signed at once with both keys so the new key is usable immediately.
    Recorded (old and new key ids) in the tenant's server stream, in the same transaction."""
    with tenant_context(tenant):
        state = _locked_state(tenant)
        before = _key_ids_by_status()
        LogSigningKey.objects.filter(status=KeyStatus.RETIRING).update(
            status=KeyStatus.RETIRED, retired_at=timezone.now()
        )
        LogSigningKey.objects.filter(status=KeyStatus.ACTIVE).update(status=KeyStatus.RETIRING)
        new_key = _create_key(tenant, KeyStatus.ACTIVE)
        _extend_and_sign(tenant, state, target=state.size, force=True)
        append_server_record(
            tenant,
            Event.ADMIN_SIGNING_KEY_ROTATED,
            {"old": before, "new": _key_ids_by_status()},
            actor=actor,
        )
        return new_key


def finish_key_rotation(tenant: Tenant, *, actor: str) -> int:
    """Stop co-signing with retiring keys; they stay listed to verify old checkpoints. With no
    rotation under way this is a no-op (0, nothing recorded)."""
    with tenant_context(tenant):
        before = _key_ids_by_status()
        retired = LogSigningKey.objects.filter(status=KeyStatus.RETIRING).update(
            status=KeyStatus.RETIRED, retired_at=timezone.now()
        )
        if retired:
            append_server_record(
                tenant,
                Event.ADMIN_SIGNING_KEY_ROTATION_FINISHED,
                {"old": before, "new": _key_ids_by_status()},
                actor=actor,
            )
        return retired


def _key_ids_by_status() -> dict[str, list[str]]:
    """The tenant's key ids (hex, as in verifier keys) by status, oldest first: what a rotation
    record shows as its old and new values."""
    out: dict[str, list[str]] = {status: [] for status in KeyStatus.values}
    for key_id, status in LogSigningKey.objects.order_by("pk").values_list("key_id", "status"):
        out[status].append(key_id)
    return out


# --------------------------------------------------------------------------- integration


StateRow = TypeVar("StateRow", TreeState, SealState)


def _locked_row(model: type[StateRow], tenant: Tenant) -> StateRow:
    """The tenant's one row of `model`, row-locked until the transaction ends (created first if
    the tenant has none yet)."""
    state = model.objects.select_for_update().filter(tenant=tenant).first()
    if state is None:
        try:
            with transaction.atomic():
                model.objects.create(tenant=tenant)
        except IntegrityError:
            pass  # another worker created it first; lock theirs
        state = model.objects.select_for_update().get(tenant=tenant)
    return state


def _locked_state(tenant: Tenant) -> TreeState:
    """The tree state, row-locked: what serialises the integrator's passes."""
    return _locked_row(TreeState, tenant)


def _split(stored: bytes | memoryview) -> list[bytes]:
    """The stored compact range (a BinaryField: bytes, or a memoryview on Postgres) as hashes."""
    blob = bytes(stored)
    return [blob[i : i + merkle.HASH_SIZE] for i in range(0, len(blob), merkle.HASH_SIZE)]


def _planned_proof(
    nodes: StoredNodes, fn: Callable[[merkle.SubtreeHashFn, int, int], list[bytes]], first: int, second: int
) -> list[bytes]:
    """`fn(nodes, first, second)` after fetching every stored node it reads in one statement."""
    wanted: list[tuple[int, int]] = []

    def record(level: int, index: int) -> bytes:
        wanted.append((level, index))
        return b"\x00" * merkle.HASH_SIZE

    fn(record, first, second)
    nodes.prefetch(wanted)
    return fn(nodes.subtree_hash, first, second)


def _extend_and_sign(
    tenant: Tenant, state: TreeState, *, target: int, force: bool = False
) -> Checkpoint | None:
    """Extend the locked tree to `target` leaves and sign it, after proving it consistent with
    the last signed checkpoint. Refuses (raises) rather than sign anything it cannot prove."""
    origin = keys.log_origin(tenant)
    last = Checkpoint.objects.order_by("-id").first()
    if target == state.size and last is not None and last.size == state.size and not force:
        return None
    if target < state.size:
        raise IntegrationRefused(f"the log shrank from {state.size} to {target} leaves")

    try:
        compact = merkle.CompactRange(state.size, _split(state.compact_hashes))
    except merkle.MerkleError as exc:
        raise IntegrationRefused(f"stored tree state is malformed: {exc}") from exc
    nodes = StoredNodes()
    with timing.phase("read_leaves"):  # and the stored frontier they extend
        frontier = merkle.perfect_subtrees(0, state.size)
        nodes.prefetch(frontier)
        try:
            stored_frontier = [nodes.subtree_hash(level, index) for level, index in frontier]
        except merkle.TreeRangeError as exc:
            raise IntegrationRefused(f"stored tree nodes are incomplete: {exc}") from exc
        if tuple(stored_frontier) != compact.hashes:
            raise IntegrationRefused("stored tree state disagrees with the stored tree nodes")
        leaves = sources.leaf_hashes(tenant, state.size, target)
    if len(leaves) != target - state.size or any(len(h) != merkle.HASH_SIZE for h in leaves):
        raise IntegrationRefused(f"leaves {state.size}..{target} are not contiguous 32-byte hashes")
    with timing.phase("compute_nodes"):
        new_nodes = compact.extend(leaves)
        nodes.add(new_nodes)
        root = compact.root()

    if last is not None:
        with timing.phase("consistency"):
            _check_consistent(nodes, last, origin, target, root)

    with timing.phase("write_nodes"):
        treestore.insert_nodes(tenant.pk, new_nodes)
    with timing.phase("sign"):
        _active_key(tenant)
        signers = _signers()
        signed = note.sign_checkpoint(note.Checkpoint(origin, target, root), signers)
        checkpoint = Checkpoint.objects.create(tenant=tenant, size=target, root=root, note=signed)
        state.size = target
        state.compact_hashes = b"".join(compact.hashes)
        state.updated_at = timezone.now()
        state.save(update_fields=["size", "compact_hashes", "updated_at"])
    return checkpoint


def _check_consistent(nodes: StoredNodes, last: Checkpoint, origin: str, target: int, root: bytes) -> None:
    """Refuse unless the tree of `target` leaves (root `root`) extends the last signed checkpoint."""
    # Trust the note that clients saw, not a column that could have been edited.
    try:
        previous = note.open_checkpoint(last.note, verifiers(), origin)
    except note.NoteError as exc:
        raise IntegrationRefused(f"the last checkpoint does not verify: {exc}") from exc
    if previous.size > target:
        raise IntegrationRefused(f"the last checkpoint has {previous.size} leaves, more than {target}")
    try:
        if previous.size == target:
            if previous.root_hash != root:
                raise merkle.ConsistencyProofError("same size, different root")
        elif previous.size > 0:
            # The proof's nodes are the new ones (in memory) and old ones, fetched at once.
            proof = _planned_proof(nodes, merkle.consistency_proof, previous.size, target)
            merkle.verify_consistency(previous.size, target, proof, previous.root_hash, root)
    except merkle.MerkleError as exc:
        raise IntegrationRefused(
            f"tree of {target} leaves is not consistent with the checkpoint of {previous.size}: {exc}"
        ) from exc


def _always() -> bool:
    return True


def _chunk_leaves() -> int:
    return int(settings.SAGAPLANE_INTEGRATION_CHUNK_LEAVES)


def integrate(tenant: Tenant, *, max_leaves: int | None = None) -> Checkpoint | None:
    """Append the tenant's new leaves to its tree and sign a checkpoint; None if nothing grew.

    One transaction, holding the TreeState row lock, so two integrators never interleave."""
    return _integrate_round(tenant, max_leaves)[0]


def _integrate_round(tenant: Tenant, max_leaves: int | None) -> tuple[Checkpoint | None, bool]:
    """`integrate`, and whether the round reached the log's size as it read it (not cut short by
    the chunk): then another round now would find nothing, or only leaves committed since, whose
    own ingest hook requests the next pass."""
    with tenant_context(tenant):
        state = _locked_state(tenant)
        _active_key(tenant)
        size = sources.log_size(tenant)
        target = min(size, state.size + (max_leaves or _chunk_leaves()))
        return _extend_and_sign(tenant, state, target=target), target == size


def integrate_fully(
    tenant: Tenant, *, max_leaves: int | None = None, keep_going: Callable[[], bool] = _always
) -> Checkpoint | None:
    """Integrate until the tree holds every leaf assigned when the last round read the log (a
    backlog takes several rounds), or until `keep_going()` says stop: it is asked between rounds,
    each of which has committed. No empty round to find out it is done: one transaction (and its
    lock) fewer per call, which under sustained ingest is one per integrator pass."""
    latest = None
    while keep_going():
        checkpoint, caught_up = _integrate_round(tenant, max_leaves)
        latest = checkpoint or latest
        if checkpoint is None or caught_up:
            break
    return latest


def tenants_to_integrate() -> list[int]:
    """Ids of tenants whose log has leaves not yet in a signed checkpoint."""
    return cross_tenant.tenants_to_integrate()


# --------------------------------------------------------------------------- saga seal


class SagaRecord(Protocol):
    """A record of a saga at its leaf: a `sources.LeafRecord`, or the lean `sources.SealInput`."""

    @property
    def leaf_index(self) -> int: ...

    @property
    def record(self) -> dict[str, Any]: ...


def exact_saga_id(records: Sequence[SagaRecord], saga_id: str) -> str:
    """The saga id as its records carry it. `saga_id` is the index copy the projection and the
    URLs use (audit.jsonvalues: a NUL in an id becomes U+FFFD there); seals and disclosures name
    the exact id, which is what a verifier compares with each record's `saga_id`."""
    for leaf in records:
        sent = leaf.record.get("saga_id")
        if isinstance(sent, str) and index_text(sent) == saga_id:
            return sent
    return saga_id


def _seal_fields(records: Sequence[SagaRecord], saga_id: str) -> tuple[dict[str, Any], bool]:
    """(the seal a saga needs now, whether its latest seal already says exactly that)."""
    own = [r for r in records if r.record.get("event") != SEAL_EVENT]
    seals = [r for r in records if r.record.get("event") == SEAL_EVENT]
    leaves = [[r.leaf_index, r.record.get("_h")] for r in own]
    fields = {"saga_id": exact_saga_id(own, saga_id), "leaves": leaves, "count": len(leaves)}
    current = bool(seals) and seals[-1].record.get("leaves") == leaves
    return fields, current


SEAL_ACTOR = "system:transparency"


def _seal_stretch(tenant: Tenant, start: int, end: int) -> tuple[list[str], int | None]:
    """Seal every saga that has a record among leaves [start, end) and is in a terminal state: (the
    saga ids sealed, the leaf index of the first seal appended, None when none was).

    In bulk: the sagas' records read by leaf range (`sources.seal_inputs`), and every seal the
    pass needs appended to the server stream as one batch (one lock, one set-based store), not
    one read and one append per saga. What each seal says is `_seal_fields`'s rule."""
    with tenant_context(tenant):
        with timing.phase("seal_find"):
            sagas = sources.terminal_sagas_touched(tenant, start, end)
        with timing.phase("seal_read"):
            by_saga = sources.seal_inputs(tenant, sagas, start, end) if sagas else {}
        sealed: list[str] = []
        seals: list[tuple[str, dict[str, Any]]] = []
        with timing.phase("seal_compute"):
            for saga_id in sagas:
                records = by_saga.get(saga_id)
                if not records:
                    continue
                fields, current = _seal_fields(records, saga_id)
                if not current:
                    sealed.append(saga_id)
                    seals.append((SEAL_EVENT, fields))
        if not seals:
            return sealed, None
        # The append's own phases (rows, insert_payloads, projection_*, insert_locked) nest inside.
        with timing.phase("seal_append"):
            return sealed, sources.append_server_records(tenant, seals, actor=SEAL_ACTOR)


# One seal pass looks at most this many integrated leaves, so catching up on a long unsealed
# stretch (a backlog, or a log integrated before the watermark existed) is bounded per transaction.
SEAL_PASS_LEAVES = 50_000


def _locked_seal_state(tenant: Tenant) -> SealState:
    """The tenant's seal watermark, row-locked: what serialises seal passes. Not
    TreeState's lock, which the integrator holds while it extends and signs: sealing and
    integration run beside each other. Lock order: this row, then the tenant log (the seals'
    append); the integrator takes TreeState alone, ingest the tenant log alone, so no cycle."""
    return _locked_row(SealState, tenant)


def seal_pass(tenant: Tenant, *, max_leaves: int | None = None) -> tuple[list[str], bool]:
    """Seal the sagas finished by leaves past the tenant's seal watermark, then move the
    watermark: (saga ids sealed, whether the watermark has reached the log's size).

    The watermark follows the log, not the tree: a pass seals what has been accepted, whether or
    not it is integrated yet, so a seal often lands before its records are signed and one
    checkpoint covers both. When the
    seals landed right at the watermark (no ingest committed in between) it moves over them too:
    they are current by construction, and nothing else is left to look at.

    Self-healing by construction: the watermark (`SealState.sealed_size`) moves in the same
    transaction as the seals it vouches for, so a crash anywhere before that commit leaves the
    watermark behind and the next pass (the 1 s beat) redoes the stretch. Re-running is harmless:
    `_seal_fields`'s rule appends nothing when the latest seal is current. Only sagas with a record
    in the stretch are looked at; a saga can only become finished, or outgrow its seal, through a
    new record, so nothing before the watermark needs a second look.

    Runs beside the integrator (its own lock, `_locked_seal_state`): the integrator signs the
    seals in whichever of its rounds first reads the log past them."""
    with tenant_context(tenant):
        # The SealState lock serialises seal passes per tenant, nothing else.
        state = _locked_seal_state(tenant)
        size = sources.log_size(tenant)
        if state.sealed_size >= size:
            return [], True
        start, end = state.sealed_size, min(size, state.sealed_size + (max_leaves or SEAL_PASS_LEAVES))
        sealed, first_seal = _seal_stretch(tenant, start, end)
        if first_seal == end:
            end += len(sealed)
        SealState.objects.filter(pk=state.pk).update(sealed_size=end)
        return sealed, end >= size


def seal_pending(
    tenant: Tenant, *, max_leaves: int | None = None, keep_going: Callable[[], bool] = _always
) -> list[str]:
    """Seal passes until the watermark reaches the log's size as a pass read it (or
    `keep_going()`, asked between passes, says stop); the saga ids sealed."""
    sealed: list[str] = []
    done = False
    while not done and keep_going():
        more, done = seal_pass(tenant, max_leaves=max_leaves)
        sealed.extend(more)
    return sealed


def tenants_to_seal() -> list[int]:
    """Ids of tenants with accepted leaves the seal pass has not looked at yet (or no watermark
    yet): what the beat seals, whether or not the leaves are integrated."""
    return cross_tenant.tenants_to_seal()


# --------------------------------------------------------------------------- exports


def request_export(
    tenant: Tenant,
    *,
    actor: str,
    first: int | None = None,
    end: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Export:
    """A queued export, recorded in the server stream; the task `transparency.tasks.build_export`
    fills it in."""
    with tenant_context(tenant):
        export = Export.objects.create(
            tenant=tenant, first=first, end=end, since=since, until=until, requested_by=actor
        )
        append_server_record(
            tenant,
            Event.AUDIT_EXPORT_REQUESTED,
            {
                "export": str(export.pk),
                "old": None,
                "new": {"status": export.status, "first": first, "end": end, "since": since, "until": until},
            },
            actor=actor,
        )
        # Best effort: with the broker down the request still answers 202 (its commit stands) and
        # the stale sweep sends the message later.
        after_commit(f"queue export {export.pk}", lambda: _enqueue_export(export))
        return export


def record_export_download(tenant: Tenant, export: Export, *, actor: str) -> None:
    """Who was handed which export (its range, checkpoint and digest), in the server stream. A
    download changes no state, so the record names what was disclosed instead of old and new
    values; the caller serves the file only after this is written in its transaction."""
    with tenant_context(tenant):
        append_server_record(
            tenant,
            Event.AUDIT_EXPORT_DOWNLOADED,
            {
                "export": str(export.pk),
                "first": export.first,
                "end": export.end,
                "checkpoint_size": export.checkpoint.size if export.checkpoint is not None else None,
                "sha256": export.sha256,
            },
            actor=actor,
        )


def _enqueue_export(export: Export) -> None:
    from transparency.tasks import build_export

    build_export.delay(str(export.pk), export.tenant_id)


def _export_stale_after() -> timedelta:
    return timedelta(minutes=getattr(settings, "SAGAPLANE_EXPORT_STALE_MINUTES", 10))


def _export_max_attempts() -> int:
    return max(1, int(getattr(settings, "SAGAPLANE_EXPORT_MAX_ATTEMPTS", 3)))


def record_export_progress(tenant: Tenant, export_id: Any, attempt: int, done: int, total: int) -> None:
    """Progress is its own short transaction so pollers (and the stale sweep) see it while the
    build runs. Fenced on `attempt`: a build the sweep has replaced writes nothing."""
    with tenant_context(tenant):
        Export.objects.filter(pk=export_id, status=ExportStatus.RUNNING, attempts=attempt).update(
            records_done=done, records_total=total, heartbeat_at=timezone.now()
        )


def finish_export(tenant: Tenant, export_id: Any, attempt: int, **fields: Any) -> bool:
    """Record the end of build `attempt`; False (and nothing written) if it no longer owns the
    export, i.e. the sweep re-queued or failed it meanwhile."""
    with tenant_context(tenant):
        return bool(
            Export.objects.filter(pk=export_id, status=ExportStatus.RUNNING, attempts=attempt).update(
                finished_at=timezone.now(), heartbeat_at=timezone.now(), **fields
            )
        )


@dataclass(frozen=True)
class ExportClaim:
    export: Export
    checkpoint: Checkpoint
    previous: Export | None
    first: int
    end: int
    attempt: int


def _claim_export(tenant: Tenant, export_id: Any) -> ExportClaim | None:
    """Mark a queued export running as the next attempt (one transaction; a conditional UPDATE, so
    a duplicate or redelivered message finds nothing to claim). The first claim fixes the range,
    checkpoint and predecessor; a retry reuses them, so every attempt builds the same bundle."""
    from transparency.bundles import resolve_range

    with tenant_context(tenant):
        # Lock only the export row (Postgres refuses FOR UPDATE across the nullable joins).
        export = (
            Export.objects.select_for_update(of=("self",))
            .select_related("checkpoint", "previous")
            .get(pk=export_id)
        )
        if export.status != ExportStatus.QUEUED:
            return None
        if export.checkpoint is not None and export.first is not None and export.end is not None:
            checkpoint, previous = export.checkpoint, export.previous
            first, end = export.first, export.end
        else:
            # The newest the quorum of witnesses cosigned, so the export verifies under the policy.
            latest = witnesses.proving_checkpoint(0)
            if latest is None:
                raise IntegrationRefused("the log has no signed checkpoint yet")
            checkpoint = latest
            previous = (
                Export.objects.filter(status=ExportStatus.DONE)
                .exclude(pk=export.pk)
                .order_by("-finished_at")
                .first()
            )
            first, end = resolve_range(tenant, export, checkpoint)
        attempt = export.attempts + 1
        claimed = Export.objects.filter(
            pk=export.pk, status=ExportStatus.QUEUED, attempts=export.attempts
        ).update(
            status=ExportStatus.RUNNING,
            first=first,
            end=end,
            checkpoint=checkpoint,
            previous=previous,
            records_done=0,
            records_total=end - first,
            attempts=attempt,
            heartbeat_at=timezone.now(),
        )
        return ExportClaim(export, checkpoint, previous, first, end, attempt) if claimed else None


def _fail_unclaimed(tenant: Tenant, export_id: Any, reason: str) -> None:
    with tenant_context(tenant):
        Export.objects.filter(pk=export_id, status=ExportStatus.QUEUED).update(
            status=ExportStatus.FAILED, error=reason[:2000], finished_at=timezone.now()
        )


def _stored_sha256(name: str) -> str:
    from transparency.storage import get_storage

    digest = hashlib.sha256()
    with get_storage().open(name) as stored:
        for block in iter(lambda: stored.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_storage_name(tenant: Tenant, export_id: Any) -> str:
    return f"tenant-{tenant.pk}/{export_id}.tar.gz"


def build_export(tenant: Tenant, export_id: Any) -> None:
    """Build and store a WORM export; idempotent and restartable.

    Several short transactions (claim, one per chunk of records read, finish) so progress is
    visible while it runs. The bundle is built in temporary files; the storage publishes it under
    its final name atomically and write-once, and the row is marked done only after that. So a
    worker killed at any point leaves either no file (a retry rebuilds it) or the complete file
    (a retry adopts it: every attempt builds against the same checkpoint and range)."""
    from transparency.bundles import BundleUnavailable, manifest_for, pack_export, write_records
    from transparency.storage import get_storage

    try:
        claim = _claim_export(tenant, export_id)
    except (IntegrationRefused, BundleUnavailable) as exc:
        # Deterministic refusals (no checkpoint yet, a range outside the log): a retry would only
        # refuse again, so fail it now rather than leave it for the sweep to re-queue forever.
        _fail_unclaimed(tenant, export_id, str(exc))
        raise
    if claim is None:
        return
    attempt = claim.attempt
    name = export_storage_name(tenant, export_id)
    storage = get_storage()
    try:
        if not storage.exists(name):
            with tempfile.TemporaryFile() as records_file:
                sha, heads = write_records(
                    tenant,
                    claim.first,
                    claim.end,
                    records_file,
                    lambda done: record_export_progress(
                        tenant, export_id, attempt, done, claim.end - claim.first
                    ),
                )
                with tenant_context(tenant):
                    manifest = manifest_for(
                        tenant, claim.export, claim.checkpoint, claim.previous, claim.first, claim.end
                    )
                manifest.update(records_sha256=sha, stream_heads=heads)
                with pack_export(records_file, manifest, manifest["checkpoint"]) as archive:
                    try:
                        storage.create(name, archive)
                    except FileExistsError:
                        # An attempt presumed dead published after all; its file is equivalent.
                        log.warning("export %s: adopting the file an earlier attempt published", export_id)
        finish_export(
            tenant,
            export_id,
            attempt,
            status=ExportStatus.DONE,
            storage_name=name,
            sha256=_stored_sha256(name),
            records_done=claim.end - claim.first,
            error="",
        )
    except Exception as exc:
        log.exception("export %s failed (attempt %s)", export_id, attempt)
        finish_export(tenant, export_id, attempt, status=ExportStatus.FAILED, error=str(exc)[:2000])
        raise


def stale_exports(now: datetime | None = None) -> list[tuple[int, Any]]:
    """(tenant id, export id) of unfinished exports with no sign of life within the stale window
    (cross-tenant: the sweep's one query, on the (status, heartbeat_at) index)."""
    return cross_tenant.stale_exports((now or timezone.now()) - _export_stale_after())


def requeue_or_fail_export(tenant: Tenant, export_id: Any, now: datetime | None = None) -> str | None:
    """One stale export, one transaction: "failed" once its builds have died
    SAGAPLANE_EXPORT_MAX_ATTEMPTS times, else "requeued" (queued again, a new message sent after
    commit); None if it showed progress or finished since the sweep's query."""
    now = now or timezone.now()
    cutoff = now - _export_stale_after()
    with tenant_context(tenant):
        export = Export.objects.select_for_update().filter(pk=export_id).first()
        if (
            export is None
            or export.status not in (ExportStatus.QUEUED, ExportStatus.RUNNING)
            or export.heartbeat_at >= cutoff
        ):
            return None
        if export.status == ExportStatus.RUNNING and export.attempts >= _export_max_attempts():
            Export.objects.filter(pk=export.pk).update(
                status=ExportStatus.FAILED,
                finished_at=now,
                heartbeat_at=now,
                error=(
                    f"gave up after {export.attempts} attempt(s): each build stopped making progress "
                    f"for {_export_stale_after()} (worker lost?)"
                ),
            )
            return "failed"
        # A running build that went quiet is presumed dead (its late writes are fenced off by the
        # attempt number); a queued one lost its message. Either way: queue it again. The attempt
        # is counted when a worker claims it, so a lost message costs no attempt.
        Export.objects.filter(pk=export.pk).update(status=ExportStatus.QUEUED, heartbeat_at=now)
        after_commit(f"re-queue export {export.pk}", lambda: _enqueue_export(export))
        return "requeued"


def sweep_stale_exports(now: datetime | None = None) -> dict[str, list[str]]:
    """The periodic sweep: re-queue or fail every stale export; {"requeued": [...], "failed": [...]}."""
    outcome: dict[str, list[str]] = {"requeued": [], "failed": []}
    tenants: dict[int, Tenant] = {}
    for tenant_id, export_id in stale_exports(now):
        tenant = tenants.get(tenant_id) or tenants.setdefault(tenant_id, Tenant.objects.get(pk=tenant_id))
        result = requeue_or_fail_export(tenant, export_id, now)
        if result is not None:
            outcome[result].append(str(export_id))
    return outcome
