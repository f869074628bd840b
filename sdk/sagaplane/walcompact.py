"""What may leave a segmented WAL, and the chained record that says what left.

A sealed segment is removed when (1) the control plane has acknowledged every record in it (an
attached shipper's verified cursor is past its end: a WAL never shipped is never compacted) and
(2) no saga that still needs it is open. Segments leave as a prefix of the log: a saga pins the
segment it started in and everything after it, so every segment before the oldest pinning saga's
start holds only settled sagas.

A saga pins while it is open (no SAGA_COMPLETE / SAGA_ABORTED yet) and its lease holds (its last
record, SAGA_LEASE included, is younger than its `lease_ttl`). Past its lease the control plane
counts the saga as orphaned and its recovery takes it over from the records it already holds (they
were acknowledged), so a saga whose process died cannot pin the disk for ever.

Before the files go, a WAL_CHAIN_GAP record in agent-saga's format is chained at the tail:
`ranges` (the seqs that left, as runs), `removed`, `removed_digest` (agent-saga's `digest_of`:
SHA-256 over the removed records' `_h`), `reason`, and `segments` (the bases of the files, so a
crash after the record but before the files went is finished at the next open). An earlier
attestation that leaves with the segments has its ranges carried into the new one, so what stays on
disk verifies on its own (`sagaplane verify-wal`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from .chain import GAP_EVENT, HASH_FIELD, SeqRanges, content_digest, gap_ranges
from .events import Event
from .segments import LogReader, Manifest, Segment

TERMINAL_EVENTS = frozenset({Event.SAGA_COMPLETE, Event.SAGA_ABORTED})
DEFAULT_LEASE_TTL = 3600.0  # a SAGA_START written without one (agent-saga's)


class OpenSagas:
    """saga_id -> [start base, last record's time, lease ttl] for every saga not yet terminal."""

    __slots__ = ("open",)

    def __init__(self, state: dict[str, list[Any]] | None = None) -> None:
        self.open: dict[str, list[Any]] = {k: list(v) for k, v in (state or {}).items()}

    def note(self, event: str, saga_id: Any, base: int, ts: float, ttl: Any = None) -> None:
        """One record naming `saga_id`, written at `ts` into the segment based at `base`."""
        if event in TERMINAL_EVENTS:
            self.open.pop(saga_id, None)
            return
        entry = self.open.get(saga_id)
        if entry is not None:
            entry[1] = ts
            if event == Event.SAGA_START and isinstance(ttl, (int, float)):
                entry[2] = float(ttl)  # a suspended saga's new deadline
        elif event == Event.SAGA_START and isinstance(saga_id, str):
            self.open[saga_id] = [
                base,
                ts,
                float(ttl) if isinstance(ttl, (int, float)) else DEFAULT_LEASE_TTL,
            ]

    def note_record(self, record: dict[str, Any], base: int) -> None:
        saga_id = record.get("saga_id")
        ts = record.get("ts")
        if saga_id is not None and isinstance(record.get("event"), str):
            self.note(
                record["event"],
                saga_id,
                base,
                ts if isinstance(ts, (int, float)) else 0.0,
                record.get("lease_ttl"),
            )

    def pinned_from(self, now: float) -> int | None:
        """The lowest base a saga still needs (None: none does). Sagas past their lease are dropped:
        they no longer pin anything, and a crashed agent's must not fill the manifest."""
        lapsed = [sid for sid, (_base, last, ttl) in self.open.items() if now >= last + ttl]
        for sid in lapsed:
            del self.open[sid]
        bases = [base for base, _last, _ttl in self.open.values()]
        return min(bases) if bases else None

    def snapshot(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in self.open.items()}


# A line in this WAL's own layout (wal.WAL._stamp_locked) that opens or ends a saga, or attests a
# removal: the only records opening needs (see scan_live).
_KEPT_LINE = re.compile(
    rb'\n\{"seq":\d+,"event":"(SAGA_START|SAGA_COMPLETE|SAGA_ABORTED|WAL_CHAIN_GAP)","ts":([-+.0-9eE]+),([^\n]*)'
)
_SAGA_ID = re.compile(rb'"saga_id":("(?:[^"\\]|\\.)*")')
_LEASE_TTL = re.compile(rb'"lease_ttl":([-+.0-9eE]+)')


def scan_live(data: bytes, sagas: OpenSagas, base: int) -> set[int]:
    """Fold the live segment's bytes into `sagas` at open; returns the segment bases its
    attestations name.

    Only the records that open or end a saga, or attest a removal, count: a saga's other records
    only refresh its activity, which matters to a running writer, and after a restart the writer
    that renewed them is gone. In this WAL's own layout those lines are found and read by pattern
    (the fields of a saga's start and end are flat, so `"saga_id":"` cannot occur inside a value
    unescaped), which keeps opening at a few milliseconds per MiB; a WAL holding lines of another
    layout (agent-saga's) is parsed line by line."""
    attested: set[int] = set()
    complete = b"\n" + data[: data.rfind(b"\n") + 1]  # each line after a newline, as the pattern wants
    own = complete.count(b'\n{"seq":') == complete.count(b"\n") - 1 and b'\n{"seq": ' not in complete
    if not own:
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                sagas.note_record(record, base)
                attested.update(attested_segments(record))
        return attested
    for match in _KEPT_LINE.finditer(complete):
        event, ts, rest = match.group(1).decode(), float(match.group(2)), match.group(3)
        if event == GAP_EVENT:
            attested.update(attested_segments(json.loads(match.group(0)[1:])))
            continue
        found = _SAGA_ID.search(rest)
        if found is None:
            continue
        ttl = _LEASE_TTL.search(rest) if event == Event.SAGA_START else None
        quoted = found.group(1)
        saga_id = json.loads(quoted) if b"\\" in quoted else quoted[1:-1].decode("utf-8")
        sagas.note(event, saga_id, base, ts, float(ttl.group(1)) if ttl else None)
    return attested


def removable(manifest: Manifest, acknowledged: int | None, pinned_from: int | None) -> list[Segment]:
    """The sealed segments that may leave now: a prefix, acknowledged and before every pin."""
    if acknowledged is None:
        return []
    limit = acknowledged if pinned_from is None else min(acknowledged, pinned_from)
    out: list[Segment] = []
    for seg in manifest.segments:
        if seg.end > limit:
            break
        out.append(seg)
    return out


def as_runs(seqs: Iterable[int]) -> list[list[int]]:
    """Seqs as sorted [start, end] runs (agent-saga's `integrity.as_runs`)."""
    runs: list[list[int]] = []
    for seq in sorted(seqs):
        if runs and seq == runs[-1][1] + 1:
            runs[-1][1] = seq
        elif not runs or seq > runs[-1][1]:
            runs.append([seq, seq])
    return runs


def attestation(path: Any, gone: list[Segment]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The WAL_CHAIN_GAP fields for removing `gone`, and the `trimmed` mark (the last removed record)
    for the manifest. Reads the segments (immutable) one line at a time."""
    seqs: list[int] = []
    digest = hashlib.sha256()
    last: dict[str, Any] = {}
    count = 0
    carried: list[tuple[int, int]] = []  # what attestations leaving with these segments attested
    for seg in gone:
        with LogReader(path, seg.base) as reader:
            while reader.tell() < seg.end:
                line = reader.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                record = json.loads(line)
                count += 1
                carried += attested_runs(record)
                if type(record.get("seq")) is int:
                    seqs.append(record["seq"])
                # agent-saga's digest_of: each record's hash, in order.
                digest.update((record.get(HASH_FIELD) or content_digest(record, "")).encode("ascii"))
                last = record
    runs = [list(r) for r in SeqRanges([*((a, b) for a, b in as_runs(seqs)), *carried]).intervals]
    fields = {
        "ranges": runs,
        "removed": sum(b - a + 1 for a, b in runs),
        "removed_digest": digest.hexdigest(),
        "reason": f"compaction: {count} record(s) in {len(gone)} acknowledged segment(s) of settled sagas",
        "segments": [seg.base for seg in gone],
    }
    trimmed = {"end": gone[-1].end, "hash": last.get(HASH_FIELD), "seq": last.get("seq")}
    return fields, trimmed


def attested_runs(record: dict[str, Any]) -> list[tuple[int, int]]:
    if record.get("event") != GAP_EVENT:
        return []
    runs = gap_ranges(record)
    return [] if isinstance(runs, str) else runs


def attested_segments(record: dict[str, Any]) -> list[int]:
    """The segment bases a WAL_CHAIN_GAP record of ours says it removed ([] for anything else)."""
    if record.get("event") != GAP_EVENT:
        return []
    bases = record.get("segments")
    return [b for b in bases if type(b) is int] if isinstance(bases, list) else []


__all__ = [
    "OpenSagas",
    "TERMINAL_EVENTS",
    "as_runs",
    "attestation",
    "attested_segments",
    "removable",
    "scan_live",
]
