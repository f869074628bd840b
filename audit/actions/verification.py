"""Verification: a batch walked from the stream's stored head (`plan_batch`), with what only the
server knows layered on top (records it already holds, attested gaps); the first break refuses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from sagaplane.chain import ChainBreak, ChainWalk, SeqRanges, attested_ranges, content_breaks

from audit.actions.common import IngestRefused
from audit.actions.parsing import Incoming
from audit.models import GENESIS, Record, Stream, TenantLog, leaf_blocks


def _chain_error(rec: Incoming, code: str, detail: str, status: int = 422, **extra: Any) -> IngestRefused:
    return IngestRefused(
        code,
        f"record #{rec.index} (seq={rec.seq}): {detail}",
        status=status,
        seq=rec.seq,
        index=rec.index,
        context=extra,
    )


@dataclass(slots=True)
class Plan:
    new: list[tuple[Incoming, int]]  # (record, position)
    duplicates: int


class _Held:
    """What the stream already holds, read only when a batch does not just extend the head (most
    never need it): a record by hash (`get`: the index by leaf block, over the stream's own leaves)
    and hashes by position (`hash_at`: one range of the stream's positions, as many as the batch
    can cover). Both are in the append order or bounded by the blocks searched; nothing the
    path that extends a head pays for."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._found: dict[str, tuple[int, int] | None] = {}
        self._hashes: dict[int, str] = {}

    def get(self, h: str) -> tuple[int, int] | None:
        """(position, seq) of the held record hashed `h`, or None."""
        if h not in self._found:
            rows = held_by_hash(Record.objects.filter(stream=self.stream), h, stream=self.stream)
            self._found[h] = next(iter(rows.values_list("position", "seq")[:1]), None)
        return self._found[h]

    def hash_at(self, position: int, ahead: int = 0) -> str:
        """The hash of the held record at `position` ("" when none); on a miss the `ahead`
        positions after it are read too (a re-sent batch walks held positions one by one)."""
        if position not in self._hashes:
            reach = range(position, position + 1 + ahead)
            self._hashes.update(dict.fromkeys(reach, ""))
            self._hashes.update(
                Record.objects.filter(
                    stream=self.stream, position__gte=reach.start, position__lt=reach.stop
                ).values_list("position", "h")
            )
        return self._hashes[position]


def held_by_hash(records: QuerySet[Record], h: str, *, stream: Stream | None = None) -> QuerySet[Record]:
    """`records` narrowed to those hashed `h` among the leaves of `stream` (None: the whole log),
    through the (leaf block, tenant, h) index: one probe per block of 65,536 leaves searched."""
    if stream is None:
        size = TenantLog.objects.values_list("size", flat=True).first() or 0
        first, last = 0, size - 1
    elif stream.length:
        ends = Record.objects.filter(stream=stream, position__in=[1, stream.length]).values_list(
            "leaf_index", flat=True
        )
        # A stream's leaves grow with its positions: its first and last record bound them.
        first, last = min(ends, default=0), max(ends, default=-1)
    else:
        first, last = 0, -1
    if last < first:
        return records.none()
    return records.filter(leaf_block__in=leaf_blocks(first, last), h=h)


def plan_batch(stream: Stream, batch: Sequence[Incoming]) -> Plan:
    """Walk the batch from the stored head with `sagaplane.chain.ChainWalk` (the SDK verifier's
    walk: same rules, same first bad record, same reason) and raise on the first break. What only
    the server knows is layered on top: records it already holds (a re-send is counted as
    duplicates; a different record at a held position is equivocation) and attested gaps, which
    may only cover records it never received."""
    held = _Held(stream)
    attested = attested_ranges(r.raw for r in batch)
    walk = ChainWalk(attested, head=stream.head_hash, head_seq=stream.head_seq, strict=True)
    pos = stream.length  # position of `walk.prev` (0 = before the first record)
    new: list[tuple[Incoming, int]] = []
    duplicates = 0
    for i, rec in enumerate(batch):
        at_head = pos == stream.length + len(new)
        resent = held.get(rec.h) if i == 0 and rec.ph != walk.prev else None
        if resent is not None or (not at_head and rec.ph == walk.prev):
            # A re-send of what is held: its own digest and hash prove it is the held record.
            own = content_breaks(rec.raw, rec.index)
            if own:
                raise _refusal(stream, rec, own[0], held, attested)
            if resent is None and held.hash_at(pos + 1, ahead=len(batch) - i) != rec.h:
                # prev is a held record inside the stream: the next one must be the held one too.
                raise _equivocation(stream, rec, pos + 1, held.hash_at(pos + 1))
            duplicates += 1
            pos = resent[0] if resent is not None else pos + 1
            walk.move_to(rec.h, rec.seq)
            continue
        prev = walk.prev
        breaks = walk.step(rec.index, rec.raw)
        if breaks:
            raise _refusal(stream, rec, breaks[0], held, attested)
        # An attested compaction gap: the predecessor was never shipped. Only at the head, and never
        # over a record the server holds.
        skipped = walk.gap_forgiven and rec.ph != prev
        if skipped and (not at_head or _held_position(stream, held, rec.ph) is not None):
            raise _forged_gap(rec)
        pos += 1
        new.append((rec, pos))
    return Plan(new, duplicates)


def _held_position(stream: Stream, held: _Held, h: str) -> int | None:
    """Where the stream holds the record hashed `h` (0: genesis, for a stream that has records)."""
    if h == GENESIS:
        return 0 if stream.length > 0 else None
    spot = held.get(h)
    return None if spot is None else spot[0]


def _refusal(
    stream: Stream, rec: Incoming, brk: ChainBreak, held: _Held, attested: SeqRanges
) -> IngestRefused:
    """The walk's first break as the API's refusal. A broken link that claims a predecessor the
    server holds is named for what it is: a fork of held history (equivocation), or, when the
    batch attests a gap, an attempt to attest away held records (forged_gap)."""
    # A record that links to a held record other than the head forks held history, whichever
    # rule the walk tripped first (racing extensions of one head fail the seq check first).
    if brk.code in ("broken_link", "seq_regression", "seq_gap") and held.get(rec.h) is None:
        claimed = _held_position(stream, held, rec.ph)
        if claimed is not None:
            if attested:
                return _forged_gap(rec)
            if claimed < stream.length:
                return _equivocation(stream, rec, claimed + 1, held.hash_at(claimed + 1))
    extra: dict[str, Any] = {}
    if brk.code == "broken_link":
        extra = {"expected": brk.expected, "found": brk.found}
    return IngestRefused(brk.code, str(brk), status=422, seq=brk.seq, index=brk.index, context=extra)


def _forged_gap(rec: Incoming) -> IngestRefused:
    return _chain_error(
        rec, "forged_gap", "a WAL_CHAIN_GAP attestation cannot remove records the server already holds"
    )


def _equivocation(stream: Stream, rec: Incoming, position: int, held_hash: str) -> IngestRefused:
    return _chain_error(
        rec,
        "equivocation",
        f"stream position {position} already holds a different record",
        status=409,
        stream=stream.stream_id,
        position=position,
        held_hash=held_hash,
        offered_hash=rec.h,
    )
