"""Inclusion and consistency proofs (RFC 9162 §2.1.3, §2.1.4): generated from a hash source in
O(log n) lookups, verified by raising a `ProofError` (never by returning False)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from .hashing import (
    HASH_SIZE,
    ConsistencyProofError,
    HashSource,
    InclusionProofError,
    ProofError,
    SubtreeHashFn,
    TreeRangeError,
    _check_size,
    node_hash,
    split_point,
    subtree_root,
)

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
