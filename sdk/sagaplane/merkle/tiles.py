"""C2SP tlog-tiles: tile paths, which tiles a tree of a size has, tile contents, and a hash
source reading tiles (e.g. from object storage)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .hashing import (
    HASH_SIZE,
    HashSource,
    SubtreeHashFn,
    TilePathError,
    TreeRangeError,
    _check_size,
    _lookup_fn,
    node_hash,
)

# C2SP tlog-tiles fixes the tile height at 8, i.e. 256 hashes per full tile.
TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT


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
