"""Reads of the log: the latest checkpoint, proofs and tiles, all from stored perfect nodes.

A proof is planned first (which perfect nodes it needs, via a dry run of the SDK's own proof
functions), fetched with one indexed query, then computed: O(log n) rows, no leaf scan. On
Postgres that one query also reads the latest signed checkpoint's size (which a proof must not
exceed), so a proof is one statement (`_one_statement`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sagaplane import merkle

from core.errors import DomainError
from core.scoping import current_tenant
from tenants.models import Tenant
from transparency import queries
from transparency.models import Checkpoint, TreeNode

_PLACEHOLDER = b"\x00" * merkle.HASH_SIZE


class StoredNodes:
    """A `merkle.HashSource` over `TreeNode` rows of the active tenant, with a batch prefetch
    and an in-memory overlay for nodes written in the current transaction."""

    def __init__(self) -> None:
        self._hashes: dict[tuple[int, int], bytes] = {}

    def add(self, nodes: Iterable[merkle.Node]) -> None:
        for node in nodes:
            self._hashes[(node.level, node.index)] = node.hash

    def prefetch(self, keys: Iterable[tuple[int, int]]) -> None:
        """Fetch every missing node in one statement (per chunk on SQLite)."""
        self.fetch(keys, with_latest=False)

    def fetch(self, keys: Iterable[tuple[int, int]], *, with_latest: bool) -> int | None:
        """Fetch the missing nodes (`queries.tree_nodes`: one statement on Postgres, point lookups
        on SQLite); `with_latest` (asked on Postgres only, `queries.one_statement_proofs`): in the
        same statement, the size of the latest signed checkpoint (returned; None when there is
        none)."""
        missing = list(dict.fromkeys(k for k in keys if k not in self._hashes))
        if not missing and not with_latest:
            return None
        rows, latest = queries.tree_nodes(current_tenant().pk, missing, with_latest=with_latest)
        for level, index, digest in rows:
            self._hashes[(level, index)] = bytes(digest)
        return latest

    def subtree_hash(self, level: int, index: int) -> bytes:
        key = (level, index)
        if key not in self._hashes:
            self.prefetch([key])
        try:
            return self._hashes[key]
        except KeyError:
            raise merkle.TreeRangeError(f"tree node ({level}, {index}) is not stored") from None


def _plan(
    fn: Callable[..., list[bytes]], *args: int, extra: Iterable[tuple[int, int]] = ()
) -> list[tuple[int, int]]:
    """Dry-run a proof function to learn which nodes it reads."""
    wanted: list[tuple[int, int]] = list(extra)

    def record(level: int, index: int) -> bytes:
        wanted.append((level, index))
        return _PLACEHOLDER

    fn(record, *args)
    return wanted


def _planned_source(
    fn: Callable[..., list[bytes]], *args: int, extra: Iterable[tuple[int, int]] = ()
) -> StoredNodes:
    """Dry-run a proof function to learn which nodes it reads, and fetch them in one go."""
    nodes = StoredNodes()
    nodes.prefetch(_plan(fn, *args, extra=extra))
    return nodes


def _planned(fn: Callable[..., list[bytes]], *args: int) -> list[bytes]:
    return fn(_planned_source(fn, *args), *args)


def latest_checkpoint() -> Checkpoint | None:
    return Checkpoint.objects.order_by("-id").first()


# Per process: the size of each tenant's latest signed checkpoint as last seen. Only a guess to
# plan a proof by before the checkpoint is read: the proof's one statement reads the real latest
# size beside the nodes, and a guess found stale (a newer checkpoint was signed since) is replaced
# and the proof redone. Nothing is answered from it unchecked.
_latest_size_seen: dict[int, int] = {}


def _one_statement(
    fn: Callable[..., list[bytes]],
    size: int | None,
    plan_args: Callable[[int], tuple[int, ...]],
    fits: Callable[[int], bool],
    extra: Callable[[int], list[tuple[int, int]]] = lambda _: [],
) -> tuple[int, StoredNodes] | None:
    """Postgres: plan against `size` (or the latest size last seen), fetch its nodes and the
    latest signed size in one statement. None when that does not answer (SQLite, nothing seen
    yet, parameters that do not fit the size, a size beyond the signed tree, a stale guess): the
    caller's two-statement path answers, and words every refusal."""
    if not queries.one_statement_proofs():
        return None
    tenant_id = current_tenant().pk
    target = size if size is not None else _latest_size_seen.get(tenant_id)
    if target is None or not fits(target):
        return None
    nodes = StoredNodes()
    latest = nodes.fetch(_plan(fn, *plan_args(target), extra=extra(target)), with_latest=True)
    if latest is None:
        _latest_size_seen.pop(tenant_id, None)
        return None
    _latest_size_seen[tenant_id] = latest
    if target > latest or (size is None and target != latest):
        return None
    return target, nodes


def _limit(size: int | None, field: str) -> int:
    latest = latest_checkpoint()
    signed = latest.size if latest is not None else 0
    if latest is not None and queries.one_statement_proofs():
        _latest_size_seen[current_tenant().pk] = signed
    if size is None:
        return signed
    if size > signed:
        raise DomainError(
            "beyond_checkpoint",
            f"{field}: {f'{field} {size} is beyond the latest signed checkpoint (size {signed})'}",
            field=field,
        )
    return size


def inclusion(index: int, size: int | None = None) -> tuple[int, list[bytes], bytes]:
    """(size, audit path leaf-side first, leaf hash) for leaf `index` in the tree of `size`."""
    fast = _one_statement(
        merkle.inclusion_proof,
        size,
        lambda target: (index, target),
        lambda target: 0 <= index < target,
        lambda _: [(0, index)],
    )
    if fast is not None:
        size, nodes = fast
    else:
        size = _limit(size, "size")
        if index < 0 or index >= size:
            raise DomainError(
                "out_of_range", f"index: index {index} is not a leaf of a tree of size {size}", field="index"
            )
        nodes = _planned_source(merkle.inclusion_proof, index, size, extra=[(0, index)])
    return size, merkle.inclusion_proof(nodes, index, size), nodes.subtree_hash(0, index)


def consistency(first: int, second: int | None = None) -> tuple[int, list[bytes]]:
    fast = _one_statement(
        merkle.consistency_proof, second, lambda target: (first, target), lambda target: 1 <= first <= target
    )
    if fast is not None:
        second, nodes = fast
        return second, merkle.consistency_proof(nodes, first, second)
    second = _limit(second, "second")
    if first < 1:
        raise DomainError(
            "invalid", "first: first must be at least 1 (every tree extends the empty one)", field="first"
        )
    if first > second:
        raise DomainError("invalid", f"first: first {first} is greater than second {second}", field="first")
    return second, _planned(merkle.consistency_proof, first, second)


def prefix_frontier(start: int) -> list[bytes]:
    """Compact range of the first `start` leaves: what an export verifier extends with the
    exported leaves to recompute a signed root without the rest of the log."""
    return _planned(lambda source, n: list(merkle.CompactRange.from_source(source, n).hashes), start)


def tile(level: int, index: int, width: int) -> bytes:
    """C2SP tile bytes, refused unless the tile exists (at that width) under the latest checkpoint."""
    latest = latest_checkpoint()
    _check_tile_exists(level, index, width, latest.size if latest is not None else 0)
    first = index * merkle.TILE_WIDTH
    rows = list(
        TreeNode.objects.filter(level=merkle.TILE_HEIGHT * level, index__gte=first, index__lt=first + width)
        .order_by("index")
        .values_list("hash", flat=True)
    )
    if len(rows) != width:
        raise DomainError(
            "not_found", "tile: tile nodes are missing from the store", status=404, field="tile"
        )
    return b"".join(bytes(h) for h in rows)


def _check_tile_exists(level: int, index: int, width: int, size: int) -> None:
    available = (size >> (merkle.TILE_HEIGHT * level)) - index * merkle.TILE_WIDTH
    if available < width:
        raise DomainError(
            "not_found", "tile: no such tile under the latest signed checkpoint", status=404, field="tile"
        )


def entry_bundle(tenant: Tenant, index: int, width: int) -> bytes:
    """C2SP tlog-tiles entry bundle `tile/entries/<N>[.p/<W>]`: the leaf data of leaves
    [256·N, 256·N + W), each as a big-endian uint16 length then the bytes. Refused unless those
    leaves are under the latest signed checkpoint; each entry is checked against the stored
    level-0 node, so a bundle never disagrees with the hash tile a client checks it against."""
    from transparency import sources

    latest = latest_checkpoint()
    _check_tile_exists(0, index, width, latest.size if latest is not None else 0)
    first = index * merkle.TILE_WIDTH
    entries = sources.leaf_entries(tenant, first, first + width)
    stored = [
        bytes(h)
        for h in TreeNode.objects.filter(level=0, index__gte=first, index__lt=first + width)
        .order_by("index")
        .values_list("hash", flat=True)
    ]
    if len(entries) != width or len(stored) != width:
        raise DomainError("not_found", "tile: entries are missing from the store", status=404, field="tile")
    out = bytearray()
    for offset, (data, digest) in enumerate(zip(entries, stored, strict=True)):
        if merkle.leaf_hash(data) != digest:
            raise DomainError(
                "inconsistent",
                f"tile: leaf {first + offset} does not hash to its tree node",
                status=500,
                field="tile",
            )
        if len(data) > 0xFFFF:
            raise DomainError(
                "inconsistent",
                f"tile: leaf {first + offset} is too long for a bundle",
                status=500,
                field="tile",
            )
        out += len(data).to_bytes(2, "big") + data
    return bytes(out)


def proof_file(tenant: Tenant, index: int) -> str:
    """A C2SP tlog-proof file for leaf `index`: against the newest checkpoint the tenant's quorum
    of witnesses cosigned (the latest when it does not cover the leaf, or no quorum is set), with
    every cosignature gathered for it, and the record as extra data (`{"stream", "position",
    "record"}`, canonical JSON), from which a verifier computes the leaf hash it proves."""
    import json

    from sagaplane.tlogproof import format_proof

    from transparency import sources, witnesses

    checkpoint = witnesses.proving_checkpoint(index + 1)
    if checkpoint is None:
        raise DomainError(
            "no_checkpoint", "index: the log has no signed checkpoint yet", status=404, field="index"
        )
    _, path, _ = inclusion(index, checkpoint.size)
    record = next(iter(sources.records(tenant, index, index + 1)), None)
    extra = None
    if record is not None:
        carried = {"position": record.position, "record": record.record, "stream": record.stream_id}
        extra = json.dumps(carried, sort_keys=True, separators=(",", ":")).encode()
    return format_proof(index, path, witnesses.cosigned_note(checkpoint), extra)


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
