"""Hash chain over WAL records, byte-compatible with agent-saga (ARCHITECTURE §3).

The names here (canonical, content_digest, record_hash, business_fields, stamp,
verify_chain) are a stable interface: the Merkle/transparency code and the server
ingest import them, so a record chained here verifies there unchanged.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .events import Event

GENESIS = "0" * 64
HASH_FIELD = "_h"
PREV_FIELD = "_ph"
DIGEST_FIELD = "_cd"
SALT_FIELD = "_s"
REDACTED_FIELD = "_redacted"
GAP_EVENT = Event.WAL_CHAIN_GAP
HEADER_FIELDS = ("seq", "ts", "event")
META_FIELDS = frozenset({HASH_FIELD, PREV_FIELD, DIGEST_FIELD, SALT_FIELD, REDACTED_FIELD})
SALT_BYTES = 16


def canonical(obj: Any) -> bytes:
    """The exact byte form that is hashed; must match agent-saga bit for bit."""
    # == json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str),
    # with the encoder built once instead of per call.
    return _CANON.encode(obj).encode("utf-8")


def content_digest(business: dict, salt: str) -> str:
    # The salt keeps low-entropy payloads ({"amount": 42}) from being recovered from
    # their digest once the payload has been redacted.
    return hashlib.sha256(salt.encode("ascii") + canonical(business)).hexdigest()


def record_hash(prev_hash: str, seq: Any, ts: Any, event: str, digest: str) -> str:
    # Hashing the digest rather than the payload is what lets redaction keep the chain.
    tt = type(ts)
    if (
        type(seq) is int
        and (tt is float and ts - ts == 0.0 or tt is int)  # finite float (not NaN/inf) or int
        and type(event) is str
        and type(prev_hash) is str
        and type(digest) is str
    ):
        # The usual shape, without the encoder: the same bytes as canonical() (sorted keys,
        # compact separators, ints and finite floats by repr, strings by json's own encoder).
        text = (
            f'{{"cd":{_encode_str(digest)},"event":{_encode_str(event)},"prev":{_encode_str(prev_hash)},'
            f'"seq":{seq!r},"ts":{ts!r}}}'
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    return hashlib.sha256(
        canonical({"prev": prev_hash, "seq": seq, "ts": ts, "event": event, "cd": digest})
    ).hexdigest()


_CANON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
_encode_str = json.encoder.encode_basestring  # the string form json.dumps(ensure_ascii=False) writes


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


# Strict: anything that is not plain JSON (NaN, sets, objects...) raises, so the caller can fall
# back to its JSON projection instead of letting `default=str` guess.
_CANON_STRICT = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_refuse
)


def canonical_strict(obj: Any) -> bytes:
    """`canonical(obj)` for plain JSON values; TypeError/ValueError for anything else.

    For every value it accepts, `canonical(json.loads(out)) == out`: the bytes are both the
    digest input and a valid JSON text whose re-canonicalisation is itself (what a verifier does).
    """
    return _CANON_STRICT.encode(obj).encode("utf-8")


def record_hash_fast(prev_hash: str, seq: int, ts: float, event: str, digest: str) -> str:
    """`record_hash` for an int seq and a float ts, without building a dict (the WAL's hot path).

    Byte-identical to canonical({"prev", "seq", "ts", "event", "cd"}): keys in sorted order,
    compact separators, floats by repr, strings by json's own encoder.
    """
    text = (
        f'{{"cd":{_encode_str(digest)},"event":{_encode_str(event)},"prev":{_encode_str(prev_hash)},'
        f'"seq":{int.__repr__(seq)},"ts":{float.__repr__(ts)}}}'
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Entropy:
    """os.urandom drawn in bulk: one syscall per 4 KiB instead of one per salt or id.

    Every byte is used once. A forked child drops the parent's unused bytes so the two
    processes never hand out the same salt."""

    CHUNK = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf = b""
        self._pos = 0

    def token_hex(self, nbytes: int = SALT_BYTES) -> str:
        with self._lock:
            pos = self._pos
            end = pos + nbytes
            if end > len(self._buf):
                self._buf = os.urandom(max(self.CHUNK, nbytes))
                pos, end = 0, nbytes
            self._pos = end
            return self._buf[pos:end].hex()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._buf = b""
        self._pos = 0


_entropy = _Entropy()
token_hex = _entropy.token_hex
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_entropy._reset)


def business_fields(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in META_FIELDS and k not in HEADER_FIELDS}


def stamp(record: dict, prev_hash: str, *, salt: str | None = None) -> str:
    """Chain `record` in place onto `prev_hash`; returns the record's hash (the new head)."""
    salt = salt if salt is not None else os.urandom(SALT_BYTES).hex()
    digest = content_digest(business_fields(record), salt)
    this = record_hash(prev_hash, record.get("seq"), record.get("ts"), record.get("event", ""), digest)
    record[SALT_FIELD] = salt
    record[DIGEST_FIELD] = digest
    record[PREV_FIELD] = prev_hash
    record[HASH_FIELD] = this
    return this


def redact_record(record: dict, *, reason: str = "erasure-request") -> dict:
    """A stub that keeps the record's place in the chain but none of its content or salt."""
    if record.get(HASH_FIELD) is None or record.get(DIGEST_FIELD) is None:
        raise ValueError("cannot redact an unchained record: nothing would prove it existed")
    kept = {k: record[k] for k in HEADER_FIELDS if k in record}
    for k in (HASH_FIELD, DIGEST_FIELD, PREV_FIELD):
        if k in record:
            kept[k] = record[k]
    kept[REDACTED_FIELD] = reason
    return kept


# -- gap attestations: intervals, never sets of seqs ------------------------------------------------

MAX_SEQ = 2**62
"""The largest seq a gap attestation may name (the control plane refuses larger seqs in a record)."""

MAX_GAP_RANGES = 100_000
"""The most [start, end] ranges one WAL_CHAIN_GAP record may carry. agent-saga writes one range per
run of removed seqs; a compaction of a long, interleaved log stays far below this, and the bound
keeps what one record can make a verifier do proportional to its size."""

SHOWN_MISSING = 5  # how many missing seqs a break names (agent-saga's message shape)


class SeqRanges:
    """A set of seqs as sorted, disjoint, non-adjacent closed intervals.

    Memory is one entry per interval and every query is a binary search: what a range attests
    costs the same whether it covers 2 seqs or 2**62, so a verifier's work is bounded by the bytes
    of the records it reads, never by the numbers written in them."""

    __slots__ = ("_covered_before", "_ends", "_starts")

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        starts: list[int] = []
        ends: list[int] = []
        for start, end in sorted(runs):
            if starts and start <= ends[-1] + 1:  # overlapping or adjacent: one interval
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(start)
                ends.append(end)
        self._starts = starts
        self._ends = ends
        # _covered_before[i]: how many seqs the intervals before interval i cover.
        self._covered_before = [0]
        for start, end in zip(starts, ends, strict=True):
            self._covered_before.append(self._covered_before[-1] + end - start + 1)

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __len__(self) -> int:
        """How many seqs are covered (not how many intervals)."""
        return self._covered_before[-1]

    @property
    def intervals(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def __contains__(self, seq: object) -> bool:
        if type(seq) is not int:
            return False
        i = bisect.bisect_right(self._starts, seq) - 1
        return i >= 0 and seq <= self._ends[i]

    def _covered_up_to(self, seq: int) -> int:
        """How many covered seqs are < seq."""
        i = bisect.bisect_right(self._starts, seq - 1) - 1  # the last interval starting before seq
        if i < 0:
            return 0
        return self._covered_before[i] + min(self._ends[i], seq - 1) - self._starts[i] + 1

    def missing(self, lo: int, hi: int, *, show: int = SHOWN_MISSING) -> tuple[int, list[int]]:
        """Seqs in [lo, hi) that are not covered: how many, and the first `show` of them."""
        if hi <= lo:
            return 0, []
        count = (hi - lo) - (self._covered_up_to(hi) - self._covered_up_to(lo))
        first: list[int] = []
        seq = lo
        # Each turn either names a missing seq or jumps past a whole interval; intervals are
        # non-adjacent, so the seq after one is missing: at most 2 * show turns.
        while len(first) < min(show, count) and seq < hi:
            i = bisect.bisect_right(self._starts, seq) - 1
            if i >= 0 and seq <= self._ends[i]:
                seq = self._ends[i] + 1
            else:
                first.append(seq)
                seq += 1
        return count, first


def gap_ranges(record: dict) -> list[tuple[int, int]] | str:
    """The [start, end] runs a WAL_CHAIN_GAP record attests, or why they are malformed.

    A record without `ranges` attests nothing. Otherwise `ranges` must be a list of at most
    MAX_GAP_RANGES pairs of integers 1 <= start <= end <= MAX_SEQ (what agent-saga's `as_runs`
    writes); anything else is refused rather than guessed at, so a hostile record cannot make a
    verifier do unbounded work or attest a seq it did not name."""
    runs = record.get("ranges")
    if runs is None:
        return []
    if not isinstance(runs, list):
        return "ranges must be a list of [start, end] pairs"
    if len(runs) > MAX_GAP_RANGES:
        return f"ranges has {len(runs)} entries; at most {MAX_GAP_RANGES} are allowed"
    out: list[tuple[int, int]] = []
    for i, run in enumerate(runs):
        if not (isinstance(run, list) and len(run) == 2 and type(run[0]) is int and type(run[1]) is int):
            return f"ranges[{i}] must be a pair of integers [start, end]"
        start, end = run
        if not 1 <= start <= end <= MAX_SEQ:
            return f"ranges[{i}] must satisfy 1 <= start <= end <= {MAX_SEQ}"
        out.append((start, end))
    return out


def attested_ranges(records: Iterable[Any]) -> SeqRanges:
    """Every seq the well-formed WAL_CHAIN_GAP records among `records` attest (agent-saga semantics:
    attestations sit at the tail, so they are collected before the walk that consults them).
    Malformed attestations attest nothing; the walk reports them at their own record."""
    runs: list[tuple[int, int]] = []
    for record in records:
        if isinstance(record, dict) and record.get("event") == GAP_EVENT:
            found = gap_ranges(record)
            if not isinstance(found, str):
                runs.extend(found)
    return SeqRanges(runs)


# -- the chain walk ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainBreak:
    seq: Any
    index: int
    reason: str
    expected: str | None = None
    found: str | None = None
    code: str = "broken"  # stable name of the rule that failed (the control plane's `reason`)

    def __str__(self) -> str:
        return f"record #{self.index} (seq={self.seq}): {self.reason}"

    def as_dict(self) -> dict:
        return {"seq": self.seq, "index": self.index, "reason": self.reason, "code": self.code}


@dataclass
class ChainReport:
    checked: int = 0
    unchained: int = 0
    redacted: int = 0
    attested_gaps: int = 0
    restarts: int = 0
    head: str = GENESIS
    head_seq: Any = None
    breaks: list[ChainBreak] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.breaks

    @property
    def first_break(self) -> ChainBreak | None:
        return self.breaks[0] if self.breaks else None

    def summary(self) -> str:
        if self.intact:
            parts = [f"chain intact across {self.checked} record(s)"]
            for count, label in (
                (self.redacted, "redacted"),
                (self.attested_gaps, "attested gap(s)"),
                (self.restarts, "writer restart(s)"),
                (self.unchained, "unchained"),
            ):
                if count:
                    parts.append(f"{count} {label}")
            return ", ".join(parts) + f"; head {self.head}"
        first = self.breaks[0]
        return f"chain BROKEN at {len(self.breaks)} point(s) across {self.checked} record(s); first: {first}"


BROKEN_LINK = "record does not link to the one before it (insertion, reorder, or unattested deletion)"


def content_breaks(record: dict, index: int, claimed_prev: Any = None) -> list[ChainBreak]:
    """What a chained record proves on its own: its payload matches its digest (unless it is a
    redacted stub) and its hash follows from its header, its digest and the `_ph` it claims
    (`claimed_prev` when it carries none)."""
    seq = record.get("seq")
    digest = record.get(DIGEST_FIELD)
    breaks: list[ChainBreak] = []
    if record.get(REDACTED_FIELD):
        if business_fields(record) or SALT_FIELD in record:
            # A stub that still carries payload is not redacted; refusing it stops
            # "redacted" from becoming a way to skip the content check.
            breaks.append(
                ChainBreak(
                    seq,
                    index,
                    "redacted record still carries payload or salt",
                    code="redacted_with_payload",
                )
            )
    else:
        salt = record.get(SALT_FIELD)
        if not isinstance(salt, str):
            breaks.append(
                ChainBreak(seq, index, "salt missing but record is not marked redacted", code="salt_missing")
            )
        else:
            try:
                recomputed = content_digest(business_fields(record), salt)
            except UnicodeEncodeError:
                recomputed = ""
            if recomputed != digest:
                breaks.append(
                    ChainBreak(
                        seq,
                        index,
                        "payload does not match its content digest (a field was altered)",
                        digest,
                        recomputed,
                        code="digest_mismatch",
                    )
                )
    claimed_prev = record.get(PREV_FIELD, claimed_prev)
    stored = record.get(HASH_FIELD)
    # Whatever the fields hold (a hostile record may carry anything): canonical() hashes it.
    expected_hash = record_hash(claimed_prev, seq, record.get("ts"), record.get("event", ""), digest)  # type: ignore[arg-type]
    if expected_hash != stored:
        breaks.append(
            ChainBreak(
                seq,
                index,
                "record hash does not match its own contents (a field or the chain pointer was altered)",
                expected_hash,
                stored,
                code="hash_mismatch",
            )
        )
    return breaks


class ChainWalk:
    """The chain rule, one record at a time: the only walk there is.

    `verify_chain` (and so `sagaplane verify-wal`) runs it over a whole log; the control plane's
    ingest runs it over a batch, starting from the stream head it stores, and stops at the first
    break. Both therefore name the same first bad record for the same reason (`ChainBreak.code`).

    Rules, per record and in this order (agent-saga's `integrity.verify`, so the two agree on where
    a tampered log first breaks): a seq jump must be covered by WAL_CHAIN_GAP attestations
    (collected up front with `attested_ranges`); a seq may only go backwards by restarting at 1 (a
    reopened writer, ARCHITECTURE §3); the payload must match its digest and the hash its header;
    the record must link to the one before it unless its seq jump was attested; a WAL_CHAIN_GAP
    record must be well formed. Work per record is bounded by its size: gaps are interval
    arithmetic on `SeqRanges`.
    """

    def __init__(
        self,
        attested: SeqRanges,
        *,
        head: str = GENESIS,
        head_seq: int | None = None,
        strict: bool = False,
    ) -> None:
        self.attested = attested
        self.strict = strict
        self.report = ChainReport(head=head, head_seq=head_seq)
        self.prev = head
        self.expected_seq = 1 if head_seq is None else head_seq + 1
        self.gap_forgiven = False  # the last record's seq jump was covered by attestations

    def move_to(self, head: str, head_seq: int | None) -> None:
        """Continue after `head` (the control plane skipping records it already holds)."""
        self.prev = head
        self.expected_seq = 1 if head_seq is None else head_seq + 1

    def step(self, index: int, record: Any) -> list[ChainBreak]:
        """Check `record` (at `index` in the caller's numbering) and move past it. Returns its
        breaks, first-named first; after a break the walk continues from what the record claims,
        so one edit yields one finding, not a cascade."""
        report = self.report
        report.checked += 1
        self.gap_forgiven = False
        if not isinstance(record, dict):
            brk = ChainBreak(None, index, "record is not a JSON object", code="not_an_object")
            report.breaks.append(brk)
            return [brk]
        breaks: list[ChainBreak] = []
        seq = record.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq > self.expected_seq:
                count, first = self.attested.missing(self.expected_seq, seq)
                if count:
                    more = "" if count <= len(first) else f" (+{count - len(first)} more)"
                    breaks.append(
                        ChainBreak(
                            seq,
                            index,
                            f"{count} record(s) missing with no {GAP_EVENT} attestation: seq {first}{more}",
                            code="seq_gap",
                        )
                    )
                else:
                    report.attested_gaps += 1
                    self.gap_forgiven = True
            elif seq < self.expected_seq:
                if seq == 1:
                    report.restarts += 1
                else:
                    breaks.append(
                        ChainBreak(
                            seq,
                            index,
                            f"seq went backwards from {self.expected_seq - 1} to {seq}",
                            code="seq_regression",
                        )
                    )
            self.expected_seq = seq + 1
        elif self.strict:
            breaks.append(ChainBreak(seq, index, "record has no integer seq", code="no_seq"))

        stored = record.get(HASH_FIELD)
        if stored is None:
            report.unchained += 1
            if self.strict:
                breaks.append(ChainBreak(seq, index, "record carries no hash", code="no_hash"))
            report.breaks.extend(breaks)
            return breaks
        if record.get(DIGEST_FIELD) is None:
            breaks.append(ChainBreak(seq, index, "record carries no content digest", code="no_digest"))
        else:
            if record.get(REDACTED_FIELD):
                report.redacted += 1
            claimed_prev = record.get(PREV_FIELD, self.prev)
            own = content_breaks(record, index, claimed_prev)
            breaks.extend(own)
            hash_ok = not any(b.code == "hash_mismatch" for b in own)
            if hash_ok and claimed_prev != self.prev and not self.gap_forgiven:
                reason = BROKEN_LINK
                if claimed_prev == GENESIS:
                    reason += "; it starts a new chain (genesis): each chain is its own stream"
                breaks.append(ChainBreak(seq, index, reason, self.prev, claimed_prev, code="broken_link"))
            if record.get("event") == GAP_EVENT:
                found = gap_ranges(record)
                if isinstance(found, str):
                    reason = f"malformed {GAP_EVENT} attestation: {found}"
                    breaks.append(ChainBreak(seq, index, reason, code="malformed_gap"))
        # Continue from what the log claims so one edit yields one finding, not a cascade.
        self.prev = stored
        report.head = stored
        report.head_seq = seq
        report.breaks.extend(breaks)
        return breaks


def verify_chain(records: Iterable[dict], *, start: str = GENESIS, strict: bool = False) -> ChainReport:
    """Recompute the chain; every break is reported, the first one is what callers name.

    Same rules as agent-saga's `integrity.verify` (see `ChainWalk`), plus: a seq may only go
    backwards when it restarts at 1, and gap attestations must be well formed. Memory and time
    are bounded by the records' size, whatever seqs or ranges they name.
    """
    materialized = list(records)
    walk = ChainWalk(attested_ranges(materialized), head=start, strict=strict)
    for index, record in enumerate(materialized):
        walk.step(index, record)
    return walk.report


__all__ = [
    "GENESIS",
    "GAP_EVENT",
    "ChainBreak",
    "ChainReport",
    "MAX_GAP_RANGES",
    "MAX_SEQ",
    "ChainWalk",
    "SeqRanges",
    "attested_ranges",
    "content_breaks",
    "gap_ranges",
    "business_fields",
    "canonical",
    "content_digest",
    "record_hash",
    "redact_record",
    "stamp",
    "verify_chain",
]
