"""Hash chain over WAL records, byte-compatible with agent-saga (ARCHITECTURE §3).

The names here (canonical, content_digest, record_hash, business_fields, stamp,
verify_chain) are a stable interface: the Merkle/transparency code and the server
ingest import them, so a record chained here verifies there unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

GENESIS = "0" * 64
HASH_FIELD = "_h"
PREV_FIELD = "_ph"
DIGEST_FIELD = "_cd"
SALT_FIELD = "_s"
REDACTED_FIELD = "_redacted"
GAP_EVENT = "WAL_CHAIN_GAP"
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


def attested_seqs(records: Iterable[dict]) -> set[int]:
    """Every seq some WAL_CHAIN_GAP record claims was removed (agent-saga semantics)."""
    out: set[int] = set()
    for record in records:
        if record.get("event") != GAP_EVENT:
            continue
        for run in record.get("ranges") or []:
            try:
                start, end = int(run[0]), int(run[1])
            except (TypeError, ValueError, IndexError):
                continue
            if 0 <= end - start <= 10_000_000:
                out.update(range(start, end + 1))
    return out


@dataclass(frozen=True)
class ChainBreak:
    seq: Any
    index: int
    reason: str
    expected: str | None = None
    found: str | None = None

    def __str__(self) -> str:
        return f"record #{self.index} (seq={self.seq}): {self.reason}"

    def as_dict(self) -> dict:
        return {"seq": self.seq, "index": self.index, "reason": self.reason}


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


def verify_chain(records: Iterable[dict], *, start: str = GENESIS, strict: bool = False) -> ChainReport:
    """Recompute the chain; every break is reported, the first one is what callers name.

    Same rules as agent-saga's `integrity.verify`, so the two agree on where a
    tampered log first breaks, plus one rule agent-saga lacks: a seq may only go
    backwards when it restarts at 1 (a reopened agent-saga writer) -- any other
    backwards step is a reorder that the link check alone would also catch, but
    naming it helps the reader.
    """
    materialized = list(records)
    accounted = attested_seqs(materialized)
    report = ChainReport(head=start)
    prev = start
    expected_seq = 1
    for index, record in enumerate(materialized):
        report.checked += 1
        if not isinstance(record, dict):
            report.breaks.append(ChainBreak(None, index, "record is not a JSON object"))
            continue
        seq = record.get("seq")
        gap_forgiven = False
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq > expected_seq:
                missing = sorted(set(range(expected_seq, seq)) - accounted)
                if missing:
                    more = "" if len(missing) <= 5 else f" (+{len(missing) - 5} more)"
                    report.breaks.append(
                        ChainBreak(
                            seq,
                            index,
                            f"{len(missing)} record(s) missing with no {GAP_EVENT} attestation: "
                            f"seq {missing[:5]}{more}",
                        )
                    )
                else:
                    report.attested_gaps += 1
                    gap_forgiven = True
            elif seq < expected_seq:
                if seq == 1:
                    report.restarts += 1
                else:
                    report.breaks.append(
                        ChainBreak(seq, index, f"seq went backwards from {expected_seq - 1} to {seq}")
                    )
            expected_seq = seq + 1
        elif strict:
            report.breaks.append(ChainBreak(seq, index, "record has no integer seq"))

        stored = record.get(HASH_FIELD)
        if stored is None:
            report.unchained += 1
            if strict:
                report.breaks.append(ChainBreak(seq, index, "record carries no hash"))
            continue
        digest = record.get(DIGEST_FIELD)
        if digest is None:
            report.breaks.append(ChainBreak(seq, index, "record carries no content digest"))
            prev = stored
            continue
        if record.get(REDACTED_FIELD):
            report.redacted += 1
            extra = business_fields(record)
            if extra or SALT_FIELD in record:
                # A stub that still carries payload is not redacted; refusing it stops
                # "redacted" from becoming a way to skip the content check.
                report.breaks.append(ChainBreak(seq, index, "redacted record still carries payload or salt"))
        else:
            salt = record.get(SALT_FIELD)
            if not isinstance(salt, str):
                report.breaks.append(ChainBreak(seq, index, "salt missing but record is not marked redacted"))
            else:
                try:
                    recomputed = content_digest(business_fields(record), salt)
                except UnicodeEncodeError:
                    recomputed = ""
                if recomputed != digest:
                    report.breaks.append(
                        ChainBreak(
                            seq,
                            index,
                            "payload does not match its content digest (a field was altered)",
                            digest,
                            recomputed,
                        )
                    )
        claimed_prev = record.get(PREV_FIELD, prev)
        expected_hash = record_hash(claimed_prev, seq, record.get("ts"), record.get("event", ""), digest)
        if expected_hash != stored:
            report.breaks.append(
                ChainBreak(
                    seq,
                    index,
                    "record hash does not match its own contents (a field or the chain pointer was altered)",
                    expected_hash,
                    stored,
                )
            )
        elif claimed_prev != prev and not gap_forgiven:
            report.breaks.append(
                ChainBreak(
                    seq,
                    index,
                    "record does not link to the one before it (insertion, reorder, or unattested deletion)",
                    prev,
                    claimed_prev,
                )
            )
        # Continue from what the log claims so one edit yields one finding, not a cascade.
        prev = stored
        report.head_seq = seq
    report.head = prev
    return report


__all__ = [
    "GENESIS",
    "GAP_EVENT",
    "ChainBreak",
    "ChainReport",
    "attested_seqs",
    "business_fields",
    "canonical",
    "content_digest",
    "record_hash",
    "redact_record",
    "stamp",
    "verify_chain",
]
