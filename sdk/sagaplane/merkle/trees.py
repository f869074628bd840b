"""Trees that grow: the right edge of a log (`CompactRange`, what a server persists) and an
in-memory tree of leaf hashes (`MemoryTree`, for tests and the SDK)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .hashing import (
    _MAX_SIZE,
    EMPTY_ROOT,
    HASH_SIZE,
    HashSource,
    SubtreeHashFn,
    TreeRangeError,
    _check_size,
    _fold_right,
    _lookup_fn,
    leaf_hash,
    node_hash,
    perfect_subtrees,
    tree_root,
)
from .proofs import consistency_proof, inclusion_proof

# --------------------------------------------------------------------------- incremental builder


@dataclass(frozen=True, slots=True)
class Node:
    """A completed perfect subtree: safe to store, it never changes. (A dataclass, not a
    NamedTuple: a field named `index` would shadow `tuple.index`.)"""

    level: int
    index: int
    hash: bytes


class CompactRange:
    """Right edge of a tree of ``size`` leaves: one perfect-subtree hash per set bit of size.

    A server persists ``size`` and ``hashes`` (at most 64 hashes) and can append new
    leaves without reading anything else. Each append returns every perfect node
    it completed, which is exactly what a node table or tile writer needs to store.
    """

    __slots__ = ("_hashes", "_size")

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        _check_size("size", size)
        if len(hashes) != size.bit_count():
            raise TreeRangeError(
                f"a compact range of size {size} needs {size.bit_count()} hashes, got {len(hashes)}"
            )
        for h in hashes:
            if len(h) != HASH_SIZE:
                raise TreeRangeError("compact range hashes must be 32 bytes")
        self._size = size
        self._hashes: list[bytes] = [bytes(h) for h in hashes]

    @classmethod
    def from_source(cls, source: HashSource | SubtreeHashFn, size: int) -> CompactRange:
        """Rebuild the right edge from stored perfect nodes (popcount(size) lookups)."""
        lookup = _lookup_fn(source)
        return cls(size, [lookup(level, index) for level, index in perfect_subtrees(0, size)])

    @property
    def size(self) -> int:
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """Perfect-subtree hashes, largest (leftmost) first, matching ``perfect_subtrees(0, size)``."""
        return tuple(self._hashes)

    def append(self, leaf_hash: bytes) -> list[Node]:
        """Append one leaf hash; returns the new leaf node and every node it completed."""
        if len(leaf_hash) != HASH_SIZE:
            raise TreeRangeError("leaf hash must be 32 bytes")
        if self._size >= _MAX_SIZE:
            raise TreeRangeError("tree is full")
        index = self._size
        cur = bytes(leaf_hash)
        completed = [Node(0, index, cur)]
        level = 0
        # Each trailing 1-bit of the old size is a pending left sibling of equal height.
        while (index >> level) & 1:
            cur = node_hash(self._hashes.pop(), cur)
            level += 1
            completed.append(Node(level, index >> level, cur))
        self._hashes.append(cur)
        self._size += 1
        return completed

    def append_data(self, data: bytes) -> list[Node]:
        return self.append(leaf_hash(data))

    def extend(self, leaf_hashes: Iterable[bytes]) -> list[Node]:
        out: list[Node] = []
        for h in leaf_hashes:
            out.extend(self.append(h))
        return out

    def root(self) -> bytes:
        return _fold_right(self._hashes) if self._hashes else EMPTY_ROOT

    def copy(self) -> CompactRange:
        return CompactRange(self._size, self._hashes)

    def __repr__(self) -> str:
        return f"CompactRange(size={self._size}, root={self.root().hex()})"


# --------------------------------------------------------------------------- in-memory tree


class MemoryTree:
    """Leaf hashes in a list plus a cache of perfect-node hashes; for tests and the SDK.

    It is a :class:`HashSource`, so the module-level proof functions work on it; the
    methods below are conveniences that default ``size`` to the current size.
    """

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self._leaves: list[bytes] = []
        # Perfect nodes are immutable once complete, so caching them is always valid.
        self._cache: dict[tuple[int, int], bytes] = {}
        for h in leaf_hashes:
            self.append(h)

    @property
    def size(self) -> int:
        return len(self._leaves)

    def __len__(self) -> int:
        return len(self._leaves)

    def append(self, leaf_hash: bytes) -> int:
        """Append a leaf hash; returns its index."""
        if len(leaf_hash) != HASH_SIZE:
            raise TreeRangeError("leaf hash must be 32 bytes")
        self._leaves.append(bytes(leaf_hash))
        return len(self._leaves) - 1

    def append_data(self, data: bytes) -> int:
        return self.append(leaf_hash(data))

    def leaf(self, index: int) -> bytes:
        if not 0 <= index < len(self._leaves):
            raise TreeRangeError(f"no leaf {index} in a tree of size {len(self._leaves)}")
        return self._leaves[index]

    def subtree_hash(self, level: int, index: int) -> bytes:
        if level < 0 or index < 0 or level > 64 or (index + 1) << level > len(self._leaves):
            raise TreeRangeError(f"perfect subtree ({level}, {index}) is not complete yet")
        if level == 0:
            return self._leaves[index]
        key = (level, index)
        cached = self._cache.get(key)
        if cached is None:
            left = self.subtree_hash(level - 1, 2 * index)
            cached = node_hash(left, self.subtree_hash(level - 1, 2 * index + 1))
            self._cache[key] = cached
        return cached

    def root(self, size: int | None = None) -> bytes:
        size = len(self._leaves) if size is None else size
        self._check_within(size)
        return tree_root(self, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        size = len(self._leaves) if size is None else size
        self._check_within(size)
        return inclusion_proof(self, index, size)

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        size2 = len(self._leaves) if size2 is None else size2
        self._check_within(size2)
        return consistency_proof(self, size1, size2)

    def compact_range(self, size: int | None = None) -> CompactRange:
        size = len(self._leaves) if size is None else size
        self._check_within(size)
        return CompactRange.from_source(self, size)

    def _check_within(self, size: int) -> None:
        _check_size("size", size)
        if size > len(self._leaves):
            raise TreeRangeError(f"size {size} exceeds the tree's {len(self._leaves)} leaves")


def root_from_leaf_hashes(leaf_hashes: Iterable[bytes]) -> bytes:
    """MTH of a standalone list of leaf hashes (index 0 is the list's first element)."""
    cr = CompactRange()
    for h in leaf_hashes:
        cr.append(h)
    return cr.root()
