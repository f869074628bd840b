"""Merkle hashing (RFC 9162): the leaf and node hashes, the errors, hash sources and the perfect
subtrees whose fold is a node; what the proofs, the builders and the tiles stand on."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

HASH_SIZE = 32
# RFC 9162 §2.1.1: the hash of an empty list is the hash of the empty string.
EMPTY_ROOT = hashlib.sha256(b"").digest()

# Go's uint64 tree sizes bound every standard client; we refuse anything larger so
# that sizes we produce can always be consumed elsewhere.
_MAX_SIZE = (1 << 64) - 1


# --------------------------------------------------------------------------- errors


class MerkleError(ValueError):
    """Base class of every error raised by `sagaplane.merkle`."""


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
