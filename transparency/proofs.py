"""Reads of the log: the latest checkpoint, proofs and tiles, all from stored perfect nodes.

A proof is planned first (which perfect nodes it needs, via a dry run of the SDK's own proof
functions), fetched with one indexed query, then computed: O(log n) rows, no leaf scan."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from django.db.models import Q
from sagaplane import merkle

from tenants.models import Tenant
from transparency.models import Checkpoint, TreeNode

_PLACEHOLDER = b"\x00" * merkle.HASH_SIZE


class ProofRequestError(ValueError):
    """A proof or tile was asked for with parameters the log cannot honour; names the field."""

    def __init__(self, field: str, detail: str, code: str = "invalid") -> None:
        super().__init__(detail)
        self.field = field
        self.code = code


class StoredNodes:
    """A `merkle.HashSource` over `TreeNode` rows of the active tenant, with a batch prefetch
    and an in-memory overlay for nodes written in the current transaction."""

    def __init__(self) -> None:
        self._hashes: dict[tuple[int, int], bytes] = {}

    def add(self, nodes: Iterable[merkle.Node]) -> None:
        for node in nodes:
            self._hashes[(node.level, node.index)] = node.hash

    def prefetch(self, keys: Iterable[tuple[int, int]]) -> None:
        by_level: dict[int, set[int]] = defaultdict(set)
        for level, index in keys:
            if (level, index) not in self._hashes:
                by_level[level].add(index)
        if not by_level:
            return
        query = Q()
        for level, indices in by_level.items():
            query |= Q(level=level, index__in=sorted(indices))
        for level, index, digest in TreeNode.objects.filter(query).values_list("level", "index", "hash"):
            self._hashes[(level, index)] = bytes(digest)

    def subtree_hash(self, level: int, index: int) -> bytes:
        key = (level, index)
        if key not in self._hashes:
            self.prefetch([key])
        try:
            return self._hashes[key]
        except KeyError:
            raise merkle.TreeRangeError(f"tree node ({level}, {index}) is not stored") from None


def _planned(fn: Callable[..., list[bytes]], *args: int) -> list[bytes]:
    """Run a proof function twice: first to learn which nodes it reads, then for real."""
    wanted: list[tuple[int, int]] = []

    def record(level: int, index: int) -> bytes:
        wanted.append((level, index))
        return _PLACEHOLDER

    fn(record, *args)
    nodes = StoredNodes()
    nodes.prefetch(wanted)
    return fn(nodes, *args)


def latest_checkpoint() -> Checkpoint | None:
    return Checkpoint.objects.order_by("-id").first()


def _limit(size: int | None, field: str) -> int:
    latest = latest_checkpoint()
    signed = latest.size if latest is not None else 0
    if size is None:
        return signed
    if size > signed:
        raise ProofRequestError(
            field,
            f"{field} {size} is beyond the latest signed checkpoint (size {signed})",
            "beyond_checkpoint",
        )
    return size


def inclusion(index: int, size: int | None = None) -> tuple[int, list[bytes], bytes]:
    """(size, audit path leaf-side first, leaf hash) for leaf `index` in the tree of `size`."""
    size = _limit(size, "size")
    if index < 0 or index >= size:
        raise ProofRequestError(
            "index", f"index {index} is not a leaf of a tree of size {size}", "out_of_range"
        )
    path = _planned(merkle.inclusion_proof, index, size)
    return size, path, StoredNodes().subtree_hash(0, index)


def consistency(first: int, second: int | None = None) -> tuple[int, list[bytes]]:
    second = _limit(second, "second")
    if first < 1:
        raise ProofRequestError("first", "first must be at least 1 (every tree extends the empty one)")
    if first > second:
        raise ProofRequestError("first", f"first {first} is greater than second {second}")
    return second, _planned(merkle.consistency_proof, first, second)


def root_at(size: int) -> bytes:
    return _planned(lambda source, n: [merkle.tree_root(source, n)], size)[0]


def prefix_frontier(start: int) -> list[bytes]:
    """Compact range of the first `start` leaves: what an export verifier extends with the
    exported leaves to recompute a signed root without the rest of the log."""
    return _planned(lambda source, n: list(merkle.CompactRange.from_source(source, n).hashes), start)


def tile(level: int, index: int, width: int) -> bytes:
    """C2SP tile bytes, refused unless the tile exists (at that width) under the latest checkpoint."""
    latest = latest_checkpoint()
    size = latest.size if latest is not None else 0
    available = (size >> (merkle.TILE_HEIGHT * level)) - index * merkle.TILE_WIDTH
    if available < width:
        raise ProofRequestError("tile", "no such tile under the latest signed checkpoint", "not_found")
    first = index * merkle.TILE_WIDTH
    rows = list(
        TreeNode.objects.filter(level=merkle.TILE_HEIGHT * level, index__gte=first, index__lt=first + width)
        .order_by("index")
        .values_list("hash", flat=True)
    )
    if len(rows) != width:
        raise ProofRequestError("tile", "tile nodes are missing from the store", "not_found")
    return b"".join(bytes(h) for h in rows)


def tenant_checkpoints(tenant: Tenant) -> list[Checkpoint]:
    return list(Checkpoint.objects.filter(tenant=tenant).order_by("id"))


def inclusions(indices: list[int], size: int) -> dict[int, list[bytes]]:
    """Audit paths for many leaves of one tree, with a single prefetch of every node they need."""
    wanted: list[tuple[int, int]] = []

    def record(level: int, index: int) -> bytes:
        wanted.append((level, index))
        return _PLACEHOLDER

    for index in indices:
        merkle.inclusion_proof(record, index, size)
    nodes = StoredNodes()
    nodes.prefetch(wanted)
    return {index: merkle.inclusion_proof(nodes, index, size) for index in indices}
