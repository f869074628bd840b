"""Property tests: sagaplane.merkle against the independent pymerkle library (v7).

pymerkle's default configuration (sha256, security on) is exactly RFC 6962 hashing:
leaves are SHA-256(0x00 || data) and nodes SHA-256(0x01 || l || r). Its indices are
1-based and its inclusion path starts with the leaf hash itself. Its consistency
proofs use a different (valid, sometimes longer) layout than RFC 9162, so for those
we compare against the RFC layout evaluated with pymerkle's own range roots, and
cross-check each library's proof with the other's roots.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymerkle import InmemoryTree
from sagaplane.merkle import (
    EMPTY_ROOT,
    CompactRange,
    ConsistencyProofError,
    InclusionProofError,
    MemoryTree,
    Node,
    Tile,
    TileHashReader,
    TilePathError,
    TreeRangeError,
    consistency_proof,
    encode_tile_index,
    entries_tile_path,
    inclusion_proof,
    leaf_hash,
    node_hash,
    parse_tile_path,
    perfect_subtrees,
    root_from_leaf_hashes,
    tile_hashes,
    tile_path,
    tiles_for_growth,
    tiles_for_size,
    tree_root,
    verify_consistency,
    verify_inclusion,
)

BIG = 3000
_DATA = [hashlib.sha256(f"entry-{i}".encode()).digest()[: i % 40] for i in range(BIG)]


def _build() -> tuple[InmemoryTree, MemoryTree]:
    ref = InmemoryTree(algorithm="sha256")
    mine = MemoryTree()
    for d in _DATA:
        ref.append_entry(d)
        mine.append_data(d)
    return ref, mine


REF, MINE = _build()

sizes = st.integers(min_value=1, max_value=BIG)
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _rfc_consistency_ranges(m: int, lo: int, hi: int, whole: bool) -> list[tuple[int, int]]:
    # Literal transcription of RFC 9162 §2.1.4.1 SUBPROOF, kept separate from the
    # library's iterative version on purpose.
    if m == hi - lo:
        return [] if whole else [(lo, hi)]
    n = hi - lo
    k = 1
    while k * 2 < n:
        k *= 2
    if m <= k:
        return _rfc_consistency_ranges(m, lo, lo + k, whole) + [(lo + k, hi)]
    return _rfc_consistency_ranges(m - k, lo + k, hi, False) + [(lo, lo + k)]


def _mth(hashes: list[bytes]) -> bytes:
    # RFC 9162 §2.1.1 MTH by direct recursion: an independent reference root.
    if not hashes:
        return hashlib.sha256(b"").digest()
    if len(hashes) == 1:
        return hashes[0]
    k = 1
    while k * 2 < len(hashes):
        k *= 2
    return node_hash(_mth(hashes[:k]), _mth(hashes[k:]))


# --------------------------------------------------------------------------- agreement with pymerkle


@PROPS
@given(size=st.integers(min_value=0, max_value=BIG))
def test_roots_agree(size: int) -> None:
    assert MINE.root(size) == REF.get_root(size)


@PROPS
@given(data=st.data(), size=sizes)
def test_inclusion_agrees(data: st.DataObject, size: int) -> None:
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    ref_proof = REF.prove_inclusion(index + 1, size)
    proof = MINE.inclusion_proof(index, size)
    assert ref_proof.path[0] == MINE.leaf(index) == leaf_hash(_DATA[index])
    assert proof == ref_proof.path[1:]
    root = REF.get_root(size)
    verify_inclusion(MINE.leaf(index), index, size, proof, root)
    ref_proof.verify(MINE.leaf(index), MINE.root(size), index=index + 1, size=size)


@PROPS
@given(data=st.data(), size2=sizes)
def test_consistency_agrees(data: st.DataObject, size2: int) -> None:
    size1 = data.draw(st.integers(min_value=1, max_value=size2))
    proof = MINE.consistency_proof(size1, size2)
    expected = [REF._get_root(lo, hi) for lo, hi in _rfc_consistency_ranges(size1, 0, size2, True)]
    assert proof == expected
    root1, root2 = REF.get_root(size1), REF.get_root(size2)
    verify_consistency(size1, size2, proof, root1, root2)
    REF.prove_consistency(size1, size2).verify(MINE.root(size1), MINE.root(size2))


@settings(max_examples=200, deadline=None)
@given(leaves=st.lists(st.binary(max_size=24), min_size=1, max_size=70), data=st.data())
def test_random_small_trees(leaves: list[bytes], data: st.DataObject) -> None:
    ref = InmemoryTree(algorithm="sha256")
    for d in leaves:
        ref.append_entry(d)
    tree = MemoryTree(leaf_hash(d) for d in leaves)
    n = len(leaves)
    assert tree.root() == ref.get_root() == _mth([leaf_hash(d) for d in leaves])
    assert root_from_leaf_hashes(leaf_hash(d) for d in leaves) == tree.root()
    i = data.draw(st.integers(min_value=0, max_value=n - 1))
    assert tree.inclusion_proof(i) == ref.prove_inclusion(i + 1).path[1:]
    m = data.draw(st.integers(min_value=1, max_value=n))
    verify_consistency(m, n, tree.consistency_proof(m), ref.get_root(m), ref.get_root())


@PROPS
@given(data=st.data(), size=st.integers(min_value=2, max_value=BIG))
def test_tampered_proofs_rejected(data: st.DataObject, size: int) -> None:
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    proof = MINE.inclusion_proof(index, size)
    root = MINE.root(size)
    pos = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
    bit = data.draw(st.integers(min_value=0, max_value=255))
    bad = list(proof)
    bad[pos] = bytes(b ^ (1 << (bit % 8)) if j == bit // 8 else b for j, b in enumerate(bad[pos]))
    with pytest.raises(InclusionProofError):
        verify_inclusion(MINE.leaf(index), index, size, bad, root)
    with pytest.raises(InclusionProofError):
        verify_inclusion(MINE.leaf(index), index, size, proof[:-1], root)
    with pytest.raises(InclusionProofError):
        verify_inclusion(MINE.leaf(index), index, size, proof + [root], root)
    size1 = data.draw(st.integers(min_value=1, max_value=size - 1))
    cproof = MINE.consistency_proof(size1, size)
    with pytest.raises(ConsistencyProofError):
        verify_consistency(size1, size, cproof, MINE.root(size1), MINE.root(size - 1))
    with pytest.raises(ConsistencyProofError):
        verify_consistency(size1, size, cproof[1:], MINE.root(size1), root)


# --------------------------------------------------------------------------- incremental builder


class CountingStore:
    """A node table: (level, index) -> hash, counting lookups like a database would."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.lookups = 0

    def store(self, nodes: list[Node]) -> None:
        for node in nodes:
            assert (node.level, node.index) not in self.nodes, "a perfect node was emitted twice"
            self.nodes[(node.level, node.index)] = node.hash

    def subtree_hash(self, level: int, index: int) -> bytes:
        self.lookups += 1
        return self.nodes[(level, index)]


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=12), data=st.data())
def test_builder_with_stored_nodes_matches_memory_tree(batches: list[int], data: st.DataObject) -> None:
    store = CountingStore()
    size, edge = 0, ()
    for batch in batches:
        # Rehydrate from the persisted right edge only, as a server would per request.
        builder = CompactRange(size, edge)
        for i in range(size, size + batch):
            store.store(builder.append(MINE.leaf(i % BIG)))
        size, edge = builder.size, builder.hashes
        expected = MemoryTree(MINE.leaf(i % BIG) for i in range(size))
        assert builder.root() == expected.root() == tree_root(store, size)
        assert CompactRange.from_source(store, size).hashes == edge
    if size == 0:
        assert builder.root() == EMPTY_ROOT
        return
    # Every perfect node, and only those, was emitted.
    assert len(store.nodes) == sum(size >> level for level in range(size.bit_length()))
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    at = data.draw(st.integers(min_value=index + 1, max_value=size))
    assert inclusion_proof(store, index, at) == expected.inclusion_proof(index, at)
    size1 = data.draw(st.integers(min_value=1, max_value=size))
    assert consistency_proof(store, size1, size) == expected.consistency_proof(size1, size)


def test_builder_emits_nodes() -> None:
    cr = CompactRange()
    leaves = [leaf_hash(bytes([i])) for i in range(4)]
    assert cr.append(leaves[0]) == [Node(0, 0, leaves[0])]
    h01 = node_hash(leaves[0], leaves[1])
    assert cr.append(leaves[1]) == [Node(0, 1, leaves[1]), Node(1, 0, h01)]
    assert cr.append(leaves[2]) == [Node(0, 2, leaves[2])]
    h23 = node_hash(leaves[2], leaves[3])
    top = node_hash(h01, h23)
    assert cr.append(leaves[3]) == [Node(0, 3, leaves[3]), Node(1, 1, h23), Node(2, 0, top)]
    assert cr.hashes == (top,) and cr.root() == top
    with pytest.raises(TreeRangeError):
        CompactRange(3, [top])


# --------------------------------------------------------------------------- O(log n) lookups


def _counting(tree: MemoryTree) -> tuple[Callable[[int, int], bytes], list[int]]:
    calls = [0]

    def lookup(level: int, index: int) -> bytes:
        calls[0] += 1
        return tree.subtree_hash(level, index)

    return lookup, calls


@PROPS
@given(data=st.data(), size=sizes)
def test_proofs_use_logarithmic_lookups(data: st.DataObject, size: int) -> None:
    lookup, calls = _counting(MINE)
    bound = 2 * size.bit_length()
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    proof = inclusion_proof(lookup, index, size)
    assert calls[0] <= bound
    assert proof == MINE.inclusion_proof(index, size)
    calls[0] = 0
    size1 = data.draw(st.integers(min_value=1, max_value=size))
    consistency_proof(lookup, size1, size)
    assert calls[0] <= bound + 1
    calls[0] = 0
    tree_root(lookup, size)
    assert calls[0] == size.bit_count()


def test_lookup_count_on_large_tree() -> None:
    # A size far beyond anything we could scan: proof generation must not care.
    size = (1 << 40) + 12345
    calls = [0]

    def fake(level: int, index: int) -> bytes:
        calls[0] += 1
        assert (index + 1) << level <= size
        return hashlib.sha256(f"{level}/{index}".encode()).digest()

    inclusion_proof(fake, size - 7, size)
    assert calls[0] <= 2 * size.bit_length()
    calls[0] = 0
    consistency_proof(fake, size - 1000, size)
    assert calls[0] <= 2 * size.bit_length() + 1


def test_perfect_subtrees_rejects_non_nodes() -> None:
    assert perfect_subtrees(4, 7) == [(1, 2), (0, 6)]
    with pytest.raises(TreeRangeError):
        perfect_subtrees(1, 3)


# --------------------------------------------------------------------------- tiles


def test_tile_index_encoding() -> None:
    assert encode_tile_index(1234067) == "x001/x234/067"
    assert encode_tile_index(0) == "000"
    assert encode_tile_index(1000) == "x001/000"
    assert tile_path(0, 1234067) == "tile/0/x001/x234/067"
    assert tile_path(1, 5, 17) == "tile/1/005.p/17"
    assert entries_tile_path(1234067, 3) == "tile/entries/x001/x234/067.p/3"


@given(level=st.integers(0, 63), index=st.integers(0, 10**12), width=st.integers(1, 256))
def test_tile_path_round_trip(level: int, index: int, width: int) -> None:
    assert parse_tile_path(tile_path(level, index, width)) == Tile(level, index, width)


@pytest.mark.parametrize(
    "path",
    [
        "tile/0/1",
        "tile/0/x000/001",
        "tile/0/001/002",
        "tile/0/000.p/256",
        "tile/0/000.p/0",
        "tile/0/000.p/07",
        "tile/64/000",
        "tile/01/000",
        "tile/entries/000",
        "tiles/0/000",
        "tile/0/x001",
    ],
)
def test_bad_tile_paths(path: str) -> None:
    with pytest.raises(TilePathError):
        parse_tile_path(path)


def test_tiles_for_size() -> None:
    assert tiles_for_size(0) == []
    assert tiles_for_size(5) == [Tile(0, 0, 5)]
    assert tiles_for_size(256) == [Tile(0, 0), Tile(1, 0, 1)]
    size = 256 * 256 * 2 + 256 * 3 + 7
    tiles = tiles_for_size(size)
    assert [t for t in tiles if t.level == 2] == [Tile(2, 0, 2)]
    assert [t for t in tiles if t.level == 1][-1] == Tile(1, 2, 3)
    assert sum(t.level == 0 for t in tiles) == 256 * 2 + 3 + 1
    assert Tile(1, 2, 3).hash_coordinates() == [(8, 512), (8, 513), (8, 514)]
    assert tiles_for_growth(300, 301) == [Tile(0, 1, 45)]
    assert tiles_for_growth(511, 512) == [Tile(0, 1), Tile(1, 0, 2)]


def test_tile_reader_serves_proofs() -> None:
    size = 2900
    files = {t.path: tile_hashes(t, MINE) for t in tiles_for_size(size)}
    reads: list[str] = []

    def read_tile(level: int, index: int, width: int) -> bytes:
        reads.append(tile_path(level, index, width))
        return files[tile_path(level, index, width)]

    reader = TileHashReader(read_tile, size)
    assert tree_root(reader, size) == MINE.root(size)
    for index in (0, 255, 256, 1000, 2899):
        reads.clear()
        assert inclusion_proof(reader, index, size) == MINE.inclusion_proof(index, size)
        assert len(reads) <= 2 * size.bit_length()
    assert consistency_proof(reader, 777, size) == MINE.consistency_proof(777, size)
