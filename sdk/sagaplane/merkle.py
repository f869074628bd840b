"""RFC 9162 (RFC 6962) Merkle tree primitives for the Sagaplane transparency log.

Pure standard library. Everything here works on *leaf hashes* (``leaf_hash(data)``),
never on leaf data, because the log commits to each record's chain hash and
proofs must keep working after a payload is redacted.

Vocabulary
----------
* A *perfect subtree* ``(level, index)`` covers the ``2**level`` leaves
  ``[index * 2**level, (index + 1) * 2**level)``. Its hash never changes once
  the tree has grown past it, so a server can store it forever.
* A *hash source* answers ``subtree_hash(level, index)`` for perfect subtrees
  only. It is either a plain callable ``(level, index) -> bytes`` or any object
  with a ``subtree_hash`` method (see :class:`HashSource`). Proof generation
  asks it for O(log n) hashes and never scans leaves.
* Verification functions return ``None`` on success and raise a
  :class:`ProofError` subclass on failure. They never return ``False``: a
  caller that forgets to check a boolean would silently accept a bad proof.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "CompactRange",
    "ConsistencyProofError",
    "HashSource",
    "InclusionProofError",
    "MemoryTree",
    "MerkleError",
    "Node",
    "ProofError",
    "SubtreeHashFn",
    "Tile",
    "TileHashReader",
    "TilePathError",
    "TreeRangeError",
    "consistency_proof",
    "encode_tile_index",
    "entries_tile_path",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "parse_tile_path",
    "perfect_subtrees",
    "root_from_leaf_hashes",
    "split_point",
    "subtree_root",
    "tile_hashes",
    "tile_path",
    "tiles_for_growth",
    "tiles_for_size",
    "tree_root",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
# RFC 9162 §2.1.1: the hash of an empty list is the hash of the empty string.
EMPTY_ROOT = hashlib.sha256(b"").digest()

# C2SP tlog-tiles fixes the tile height at 8, i.e. 256 hashes per full tile.
TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT

# Go's uint64 tree sizes bound every standard client; we refuse anything larger so
# that sizes we produce can always be consumed elsewhere.
_MAX_SIZE = (1 << 64) - 1


# --------------------------------------------------------------------------- errors


class MerkleError(ValueError):
    """Base class of every error raised by this module."""


class ProofError(MerkleError):
    """A proof did not verify. The message says why."""


class InclusionProofError(ProofError):
    """An inclusion proof did not verify."""


class ConsistencyProofError(ProofError):
    """A consistency proof did not verify."""


class TreeRangeError(MerkleError):
    """A request named leaves, sizes or subtrees that do not exist in the tree."""


class TilePathError(MerkleError):
    """A tile path or tile coordinate is not valid C2SP tlog-tiles."""


# --------------------------------------------------------------------------- hashing


def leaf_hash(data: bytes) -> bytes:
    """RFC 9162 leaf hash: SHA-256(0x00 || data)."""
    return hashlib.sha256(b"\x00" + bytes(data)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 9162 interior node hash: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """Largest power of two strictly smaller than ``n`` (n >= 2): the RFC 9162 split ``k``."""
    if n < 2:
        raise TreeRangeError(f"cannot split a tree of {n} leaves")
    return 1 << ((n - 1).bit_length() - 1)


def _check_size(name: str, value: int) -> None:
    # bool is an int subclass; True as a tree size is always a caller bug.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TreeRangeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or value > _MAX_SIZE:
        raise TreeRangeError(f"{name} out of range: {value}")


# --------------------------------------------------------------------------- hash sources


SubtreeHashFn = Callable[[int, int], bytes]


@runtime_checkable
class HashSource(Protocol):
    """Anything that can return the hash of the perfect subtree ``(level, index)``."""

    def subtree_hash(self, level: int, index: int) -> bytes: ...


def _lookup_fn(source: HashSource | SubtreeHashFn) -> SubtreeHashFn:
    method = getattr(source, "subtree_hash", None)
    if callable(method):
        return method
    if callable(source):
        return source
    raise TypeError("hash source must be callable or have a subtree_hash(level, index) method")


def perfect_subtrees(start: int, end: int) -> list[tuple[int, int]]:
    """Perfect subtrees ``(level, index)``, largest first, whose fold is MTH(D[start:end]).

    Only defined for ranges that are nodes of some RFC 9162 tree: ``start`` must be
    a multiple of the smallest power of two >= ``end - start``. Every range that
    appears while building proofs (and ``[0, size)``) satisfies this; a range
    such as ``[1, 3)`` does not, because no RFC tree has a node covering it.
    """
    _check_size("start", start)
    _check_size("end", end)
    if end < start:
        raise TreeRangeError(f"empty or inverted range [{start}, {end})")
    width = end - start
    if width == 0:
        return []
    span = 1 << (width - 1).bit_length()
    if start % span:
        raise TreeRangeError(f"[{start}, {end}) is not a node of any RFC 9162 tree")
    out: list[tuple[int, int]] = []
    pos = start
    # Bits of the width from high to low: because start is aligned to the next power of
    # two, each chunk lands on its own alignment and is therefore a perfect subtree.
    for level in range(width.bit_length() - 1, -1, -1):
        if (width >> level) & 1:
            out.append((level, pos >> level))
            pos += 1 << level
    return out


def _fold_right(hashes: Sequence[bytes]) -> bytes:
    # RFC 9162 splits off the largest power of two on the left, so a node built from
    # perfect subtrees p1 > p2 > ... > pk is H(p1, H(p2, ... H(pk-1, pk))).
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = node_hash(h, acc)
    return acc


def subtree_root(source: HashSource | SubtreeHashFn, start: int, end: int) -> bytes:
    """MTH(D[start:end]) for a node range (see :func:`perfect_subtrees`).

    Costs one lookup per set bit of ``end - start``.
    """
    lookup = _lookup_fn(source)
    parts = perfect_subtrees(start, end)
    if not parts:
        return EMPTY_ROOT
    return _fold_right([lookup(level, index) for level, index in parts])


def tree_root(source: HashSource | SubtreeHashFn, size: int) -> bytes:
    """Root hash of the tree made of the first ``size`` leaves (O(log size) lookups)."""
    return subtree_root(source, 0, size)


def root_from_leaf_hashes(leaf_hashes: Iterable[bytes]) -> bytes:
    """MTH of a standalone list of leaf hashes (index 0 is the list's first element)."""
    cr = CompactRange()
    for h in leaf_hashes:
        cr.append(h)
    return cr.root()


# --------------------------------------------------------------------------- proof generation


def _inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    # RFC 9162 §2.1.3.1 PATH(m, D[n]), unrolled; siblings come out root-first, the
    # proof lists them leaf-first.
    ranges: list[tuple[int, int]] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = split_point(hi - lo)
        if index < lo + k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo += k
    ranges.reverse()
    return ranges


def _consistency_ranges(size1: int, size2: int) -> list[tuple[int, int]]:
    # RFC 9162 §2.1.4.1 SUBPROOF(m, D[n], b), unrolled. ``whole_old_tree`` is the
    # flag b: while it holds, the node equal to the old tree is its root, which the
    # verifier already has, so it is left out of the proof.
    ranges: list[tuple[int, int]] = []
    lo, hi = 0, size2
    whole_old_tree = True
    while size1 != hi:
        k = split_point(hi - lo)
        if size1 <= lo + k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo += k
            whole_old_tree = False
    if not whole_old_tree:
        ranges.append((lo, hi))
    ranges.reverse()
    return ranges


def inclusion_proof(source: HashSource | SubtreeHashFn, index: int, size: int) -> list[bytes]:
    """Audit path for leaf ``index`` in the tree of ``size`` leaves, leaf-side first.

    At most one sibling is an imperfect right edge (it sits above the point where
    the path first turns left); every other sibling is one perfect-subtree lookup.
    Total lookups are therefore bounded by about 2 * log2(size).
    """
    _check_size("index", index)
    _check_size("size", size)
    if index >= size:
        raise TreeRangeError(f"leaf index {index} not in a tree of size {size}")
    return [subtree_root(source, lo, hi) for lo, hi in _inclusion_ranges(index, size)]


def consistency_proof(source: HashSource | SubtreeHashFn, size1: int, size2: int) -> list[bytes]:
    """RFC 9162 consistency proof from the tree of ``size1`` leaves to the one of ``size2``.

    ``size1 == size2`` yields an empty proof. ``size1 == 0`` is refused: every tree
    extends the empty tree, so there is nothing to prove, and RFC 9162 verifiers
    (ours included) reject such a proof anyway.
    """
    _check_size("size1", size1)
    _check_size("size2", size2)
    if size1 == 0:
        raise TreeRangeError("no consistency proof from the empty tree: it is trivially consistent")
    if size1 > size2:
        raise TreeRangeError(f"size1 {size1} > size2 {size2}")
    return [subtree_root(source, lo, hi) for lo, hi in _consistency_ranges(size1, size2)]


# --------------------------------------------------------------------------- verification


def _check_hash(kind: type[ProofError], what: str, value: bytes) -> None:
    if not isinstance(value, bytes | bytearray | memoryview) or len(value) != HASH_SIZE:
        raise kind(f"{what} is not a {HASH_SIZE}-byte hash")


def _same(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(bytes(a), bytes(b))


def verify_inclusion(leaf_hash: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """Check an inclusion proof exactly as RFC 9162 §2.1.3.2.

    Returns ``None`` on success; raises :class:`InclusionProofError` otherwise.
    ``leaf_hash`` is the already-hashed leaf (``leaf_hash(data)``), not the data.
    """
    err = InclusionProofError
    for name, value in (("index", index), ("size", size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise err(f"{name} must be a non-negative int")
    if index >= size:
        raise err(f"leaf index {index} is not below tree size {size}")
    _check_hash(err, "leaf hash", leaf_hash)
    for i, p in enumerate(proof):
        _check_hash(err, f"proof[{i}]", p)

    fn, sn = index, size - 1
    r = bytes(leaf_hash)
    for p in proof:
        if sn == 0:
            raise err("proof has more elements than the path to the root")
        if fn & 1 or fn == sn:
            r = node_hash(bytes(p), r)
            # On the right edge the node has no right sibling: climb until we are a
            # right child again (or reach the root).
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, bytes(p))
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise err("proof has fewer elements than the path to the root")
    if not _same(r, root):
        raise err("computed root does not match the expected root")


def verify_consistency(size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes) -> None:
    """Check a consistency proof exactly as RFC 9162 §2.1.4.2.

    Returns ``None`` on success; raises :class:`ConsistencyProofError` otherwise.

    Edge cases (as in the transparency-dev conformance vectors): ``size1 > size2``
    fails; ``size1 == 0`` always fails (consistency with the empty tree proves
    nothing, so callers handle "no previous checkpoint" themselves);
    ``size1 == size2`` succeeds only with an empty proof and ``root1 == root2``.
    """
    err = ConsistencyProofError
    for name, value in (("size1", size1), ("size2", size2)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise err(f"{name} must be a non-negative int")
    if size1 > size2:
        raise err(f"size1 {size1} is greater than size2 {size2}")
    if size1 == 0:
        raise err("consistency with the empty tree is meaningless; handle size1 == 0 explicitly")
    if size1 == size2:
        if proof:
            raise err("sizes are equal but the proof is not empty")
        if not _same(root1, root2):
            raise err("sizes are equal but the roots differ")
        return
    if not proof:
        raise err("empty proof for different sizes")
    for i, p in enumerate(proof):
        _check_hash(err, f"proof[{i}]", p)

    path = [bytes(p) for p in proof]
    # When the old tree is a perfect subtree the proof omits its root, because
    # the verifier already holds it.
    if size1 & (size1 - 1) == 0:
        path.insert(0, bytes(root1))
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise err("proof has more elements than needed")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise err("proof has fewer elements than needed")
    if not _same(fr, root1):
        raise err("proof does not reproduce the old root")
    if not _same(sr, root2):
        raise err("proof does not reproduce the new root")


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


# --------------------------------------------------------------------------- tiles (C2SP tlog-tiles)


_INDEX_ELEM = re.compile(r"[0-9]{3}\Z")
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)\Z")


def encode_tile_index(n: int) -> str:
    """C2SP tile index: 3-digit groups, all but the last prefixed ``x`` (1234067 -> x001/x234/067)."""
    _check_size("tile index", n)
    groups = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        groups.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(groups))


def _width_suffix(width: int) -> str:
    if not 1 <= width <= TILE_WIDTH:
        raise TilePathError(f"tile width must be in 1..{TILE_WIDTH}, got {width}")
    return "" if width == TILE_WIDTH else f".p/{width}"


def tile_path(level: int, index: int, width: int = TILE_WIDTH) -> str:
    """``tile/<L>/<N>[.p/<W>]``; a full tile has no ``.p`` suffix."""
    if not 0 <= level <= 63:
        raise TilePathError(f"tile level must be in 0..63, got {level}")
    return f"tile/{level}/{encode_tile_index(index)}{_width_suffix(width)}"


def entries_tile_path(index: int, width: int = TILE_WIDTH) -> str:
    """``tile/entries/<N>[.p/<W>]`` for entry bundles."""
    return f"tile/entries/{encode_tile_index(index)}{_width_suffix(width)}"


@dataclass(frozen=True)
class Tile:
    """Hash tile ``(level, index, width)``.

    It holds ``width`` hashes of perfect subtrees at Merkle level ``8 * level``,
    with subtree indices ``index * 256`` up to ``index * 256 + width - 1``.
    """

    level: int
    index: int
    width: int = TILE_WIDTH

    def __post_init__(self) -> None:
        if not 0 <= self.level <= 63:
            raise TilePathError(f"tile level must be in 0..63, got {self.level}")
        if not isinstance(self.index, int) or self.index < 0:
            raise TilePathError(f"tile index must be a non-negative int, got {self.index!r}")
        _width_suffix(self.width)

    @property
    def is_partial(self) -> bool:
        return self.width < TILE_WIDTH

    @property
    def path(self) -> str:
        return tile_path(self.level, self.index, self.width)

    @property
    def hash_level(self) -> int:
        """Merkle level of the hashes this tile stores."""
        return self.level * TILE_HEIGHT

    @property
    def first_hash_index(self) -> int:
        return self.index * TILE_WIDTH

    def hash_coordinates(self) -> list[tuple[int, int]]:
        """The ``(merkle_level, subtree_index)`` of each stored hash, in file order."""
        first = self.first_hash_index
        return [(self.hash_level, first + i) for i in range(self.width)]


def parse_tile_path(path: str) -> Tile:
    """Parse ``tile/<L>/<N>[.p/<W>]`` strictly (canonical encoding only)."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "tile":
        raise TilePathError(f"not a tile path: {path!r}")
    if parts[1] == "entries":
        raise TilePathError("entry bundle paths are not hash tiles")
    if not _DECIMAL.match(parts[1]) or int(parts[1]) > 63:
        raise TilePathError(f"bad tile level in {path!r}")
    level = int(parts[1])
    rest = parts[2:]
    width = TILE_WIDTH
    if len(rest) >= 2 and rest[-2].endswith(".p"):
        w = rest[-1]
        if not _DECIMAL.match(w) or not 1 <= int(w) < TILE_WIDTH:
            raise TilePathError(f"bad partial width in {path!r}")
        width = int(w)
        rest = rest[:-2] + [rest[-2][:-2]]
    if not rest:
        raise TilePathError(f"missing tile index in {path!r}")
    index = 0
    for i, elem in enumerate(rest):
        last = i == len(rest) - 1
        digits = elem if last else elem[1:]
        if (not last and not elem.startswith("x")) or not _INDEX_ELEM.match(digits):
            raise TilePathError(f"bad tile index element {elem!r} in {path!r}")
        index = index * 1000 + int(digits)
    # Reject non-canonical spellings such as x000/001, so one tile has one path and
    # caches cannot be split or poisoned through aliases.
    if tile_path(level, index, width) != path:
        raise TilePathError(f"non-canonical tile path {path!r}")
    return Tile(level, index, width)


def tiles_for_size(size: int) -> list[Tile]:
    """Every hash tile of a tree of ``size`` leaves, level by level, full ones then the partial.

    A level-L tile exists as soon as one level-8L perfect subtree is complete. The
    list has about size/256 entries; use :func:`tiles_for_growth` to find what to
    (re)write after an append.
    """
    return tiles_for_growth(0, size)


def tiles_for_growth(old_size: int, new_size: int) -> list[Tile]:
    """Tiles of the ``new_size`` tree that did not exist, byte for byte, at ``old_size``.

    These are exactly the files a tile writer must create after growing the tree.
    Partial tiles of the old size are superseded, not listed here.
    """
    _check_size("old_size", old_size)
    _check_size("new_size", new_size)
    if old_size > new_size:
        raise TreeRangeError(f"old_size {old_size} > new_size {new_size}")
    out: list[Tile] = []
    level = 0
    while True:
        shift = level * TILE_HEIGHT
        new_count = new_size >> shift
        if new_count == 0:
            break
        old_count = old_size >> shift
        full_new = new_count // TILE_WIDTH
        for n in range(old_count // TILE_WIDTH, full_new):
            out.append(Tile(level, n))
        partial = new_count % TILE_WIDTH
        if partial and new_count != old_count:
            out.append(Tile(level, full_new, partial))
        level += 1
    return out


def tile_hashes(tile: Tile, source: HashSource | SubtreeHashFn) -> bytes:
    """Tile file content: the concatenated 32-byte hashes it stores."""
    lookup = _lookup_fn(source)
    return b"".join(lookup(level, index) for level, index in tile.hash_coordinates())


class TileHashReader:
    """A hash source backed by tile files (C2SP layout), e.g. from object storage.

    ``read_tile(level, index, width)`` must return the tile's bytes; a longer tile
    (full instead of partial) is fine. A node whose level is not a multiple of 8 is
    rebuilt from the hashes of the tile below it, so each lookup reads one tile.
    """

    def __init__(self, read_tile: Callable[[int, int, int], bytes], size: int) -> None:
        _check_size("size", size)
        self._read_tile = read_tile
        self._size = size

    def subtree_hash(self, level: int, index: int) -> bytes:
        if level < 0 or index < 0 or (index + 1) << level > self._size:
            raise TreeRangeError(f"perfect subtree ({level}, {index}) not in a tree of size {self._size}")
        tile_level, height = divmod(level, TILE_HEIGHT)
        base_level = tile_level * TILE_HEIGHT
        first = index << height
        count = 1 << height
        tile_index = first // TILE_WIDTH
        # Width as it stands at this tree size; the reader may return a longer tile.
        avail = (self._size >> base_level) - tile_index * TILE_WIDTH
        width = min(TILE_WIDTH, avail)
        data = self._read_tile(tile_level, tile_index, width)
        offset = first - tile_index * TILE_WIDTH
        if len(data) < (offset + count) * HASH_SIZE or len(data) % HASH_SIZE:
            raise TreeRangeError(f"tile {tile_path(tile_level, tile_index, width)} is too short")
        layer = [data[(offset + i) * HASH_SIZE : (offset + i + 1) * HASH_SIZE] for i in range(count)]
        while len(layer) > 1:
            layer = [node_hash(layer[i], layer[i + 1]) for i in range(0, len(layer), 2)]
        return layer[0]
