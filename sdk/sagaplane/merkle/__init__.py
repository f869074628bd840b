"""RFC 9162 (RFC 6962) Merkle tree primitives for the Sagaplane transparency log.

One package, one module per concern: `hashing` (hashes, errors, hash sources, perfect
subtrees), `proofs` (inclusion and consistency, made and checked), `trees` (`CompactRange`,
`MemoryTree`) and `tiles` (C2SP tlog-tiles). Import from here: ``sagaplane.merkle.X``.

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

from .hashing import (
    EMPTY_ROOT,
    HASH_SIZE,
    ConsistencyProofError,
    HashSource,
    InclusionProofError,
    MerkleError,
    ProofError,
    SubtreeHashFn,
    TilePathError,
    TreeRangeError,
    leaf_hash,
    node_hash,
    perfect_subtrees,
    split_point,
    subtree_root,
    tree_root,
)
from .proofs import consistency_proof, inclusion_proof, verify_consistency, verify_inclusion
from .tiles import (
    TILE_HEIGHT,
    TILE_WIDTH,
    Tile,
    TileHashReader,
    encode_tile_index,
    entries_tile_path,
    parse_tile_path,
    tile_hashes,
    tile_path,
    tiles_for_growth,
    tiles_for_size,
)
from .trees import CompactRange, MemoryTree, Node, root_from_leaf_hashes

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
