"""Integration: the tenant's new leaves appended to its tree and a checkpoint signed, after
proving the tree consistent with the last signed checkpoint (re-read from its signed note, not
from a column) with `merkle.verify_consistency`, under a row lock on `TreeState`. Any
disagreement between stored state, stored nodes and the last note refuses; nothing is signed."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.utils import timezone
from sagaplane import merkle, note

from core import timing
from core.scoping import require_tenant
from tenants.models import Tenant
from transparency import cross_tenant, keys, queries, sources
from transparency.actions.common import IntegrationRefused, locked_row
from transparency.actions.signing import active_key, key_signers, verifiers
from transparency.models import Checkpoint, TreeState
from transparency.proofs import StoredNodes


def locked_state(tenant: Tenant) -> TreeState:
    """The tree state, row-locked: what serialises the integrator's passes."""
    return locked_row(TreeState, tenant)


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


def extend_and_sign(
    tenant: Tenant, state: TreeState, *, target: int, force: bool = False
) -> Checkpoint | None:
    """Extend the locked tree to `target` leaves and sign it, after proving it consistent with
    the last signed checkpoint. Refuses (raises) rather than sign anything it cannot prove."""
    origin = keys.log_origin(tenant)
    last = Checkpoint.objects.order_by("-id").first()
    if target == state.size and last is not None and last.size == state.size and not force:
        return None
    if target < state.size:
        raise IntegrationRefused(
            "integration_refused", f"the log shrank from {state.size} to {target} leaves", status=500
        )

    try:
        compact = merkle.CompactRange(state.size, _split(state.compact_hashes))
    except merkle.MerkleError as exc:
        raise IntegrationRefused(
            "integration_refused", f"stored tree state is malformed: {exc}", status=500
        ) from exc
    nodes = StoredNodes()
    with timing.phase("read_leaves"):  # and the stored frontier they extend
        frontier = merkle.perfect_subtrees(0, state.size)
        nodes.prefetch(frontier)
        try:
            stored_frontier = [nodes.subtree_hash(level, index) for level, index in frontier]
        except merkle.TreeRangeError as exc:
            raise IntegrationRefused(
                "integration_refused", f"stored tree nodes are incomplete: {exc}", status=500
            ) from exc
        if tuple(stored_frontier) != compact.hashes:
            raise IntegrationRefused(
                "integration_refused", "stored tree state disagrees with the stored tree nodes", status=500
            )
        leaves = queries.leaf_hashes(tenant.pk, state.size, target)
    if len(leaves) != target - state.size or any(len(h) != merkle.HASH_SIZE for h in leaves):
        raise IntegrationRefused(
            "integration_refused",
            f"leaves {state.size}..{target} are not contiguous 32-byte hashes",
            status=500,
        )
    with timing.phase("compute_nodes"):
        new_nodes = compact.extend(leaves)
        nodes.add(new_nodes)
        root = compact.root()

    if last is not None:
        with timing.phase("consistency"):
            _check_consistent(nodes, last, origin, target, root)

    with timing.phase("write_nodes"):
        queries.insert_nodes(tenant.pk, new_nodes)
    with timing.phase("sign"):
        active_key(tenant)
        signers = key_signers()
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
        raise IntegrationRefused(
            "integration_refused", f"the last checkpoint does not verify: {exc}", status=500
        ) from exc
    if previous.size > target:
        raise IntegrationRefused(
            "integration_refused",
            f"the last checkpoint has {previous.size} leaves, more than {target}",
            status=500,
        )
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
            "integration_refused",
            f"tree of {target} leaves is not consistent with the checkpoint of {previous.size}: {exc}",
            status=500,
        ) from exc


# One integration appends at most settings.SAGAPLANE_INTEGRATION_CHUNK_LEAVES leaves, so a
# backlog is worked off in bounded transactions (each still signs a checkpoint) instead of one
# lock held for minutes, and a worker asked to stop can stop between two.
def _chunk_leaves() -> int:
    return int(settings.SAGAPLANE_INTEGRATION_CHUNK_LEAVES)


def integrate(tenant: Tenant, *, max_leaves: int | None = None) -> Checkpoint | None:
    """Append the tenant's new leaves to its tree and sign a checkpoint; None if nothing grew.

    In the caller's transaction (the tenant's), holding the TreeState row lock until it ends, so
    two integrators never interleave."""
    return integrate_round(tenant, max_leaves)[0]


def integrate_round(tenant: Tenant, max_leaves: int | None = None) -> tuple[Checkpoint | None, bool]:
    """`integrate`, and whether the round reached the log's size as it read it (not cut short by
    the chunk): then another round now would find nothing, or only leaves committed since, whose
    own ingest hook requests the next pass. The integrator's rounds (`transparency.tasks`) are
    each a transaction of their own, which commits the checkpoint and lets the lock go."""
    require_tenant(tenant)
    state = locked_state(tenant)
    active_key(tenant)
    size = sources.log_size(tenant)
    target = min(size, state.size + (max_leaves or _chunk_leaves()))
    return extend_and_sign(tenant, state, target=target), target == size


def tenants_to_integrate() -> list[int]:
    """Ids of tenants whose log has leaves not yet in a signed checkpoint."""
    return cross_tenant.tenants_to_integrate()
