"""The fast paths of offline verification against their reference forms.

`record_hash` and `leaf_data` build their usual shapes without the JSON encoder, and
`sagaplane.export` checks records.ndjson with a one-scan parser, hand-built hash preimages, a
second process and a bulk Merkle append. Each must give exactly what the reference gives (the
canonical encoder; `export._check_records_slow` + `CompactRange.extend`): the same hashes, the
same result, or the same refusal with the same reason -- on adversarial values and on tampered
files (hypothesis).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sagaplane import export, merkle, note
from sagaplane.chain import GENESIS, canonical, record_hash, redact_record, stamp
from sagaplane.disclosure import VerificationError
from sagaplane.leaf import leaf_data

# Strings that stress json's escaping: quotes, backslashes, control characters, U+2028, non-BMP,
# and a lone surrogate (valid in a str, unencodable as UTF-8).
NASTY = '"\\/\x00\x01\x1f\x7f\n\t\r\u2028\ud800\U0001f600é✓ aZ_0'
strings = st.one_of(st.text(max_size=12), st.text(alphabet=NASTY, max_size=12))
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-7, 1.0, -0.0, 0.0, 1e16, 1.5e300, 5e-324, 1700000000.123456, float("nan")]),
)
ints = st.one_of(st.integers(), st.integers(min_value=-(10**40), max_value=10**40), st.just(10**400))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, strings)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
    max_leaves=8,
)


def _outcome(fn: Callable[[], Any]) -> tuple:
    try:
        return ("ok", fn())
    except Exception as exc:  # the exact refusal (type and words) is part of the contract
        return (type(exc).__name__, str(exc))


def _canonical_record_hash(prev: Any, seq: Any, ts: Any, event: Any, digest: Any) -> str:
    return hashlib.sha256(
        canonical({"prev": prev, "seq": seq, "ts": ts, "event": event, "cd": digest})
    ).hexdigest()


@settings(max_examples=400, deadline=None)
@given(prev=strings, seq=scalars, ts=scalars, event=st.one_of(strings, scalars), digest=strings)
def test_record_hash_is_the_canonical_hash(prev: Any, seq: Any, ts: Any, event: Any, digest: Any) -> None:
    assert _outcome(lambda: record_hash(prev, seq, ts, event, digest)) == _outcome(
        lambda: _canonical_record_hash(prev, seq, ts, event, digest)
    )


@settings(max_examples=300, deadline=None)
@given(stream=st.one_of(strings, scalars), position=scalars, h=st.one_of(strings, scalars))
def test_leaf_data_is_the_canonical_encoding(stream: Any, position: Any, h: Any) -> None:
    assert _outcome(lambda: leaf_data(stream, position, h)) == _outcome(
        lambda: canonical({"v": 1, "stream": stream, "pos": position, "h": h})
    )


# --------------------------------------------------------------------------- records.ndjson


def _stamped(record: dict, prev: str) -> str:
    try:
        return stamp(record, prev, salt="ab" * 16)
    except (UnicodeEncodeError, ValueError):  # unencodable payload: a record no one could verify
        record.update(_s="ab" * 16, _cd="00" * 32, _ph=prev, _h="11" * 32)
        return "11" * 32


def _line(entry: dict, form: int) -> bytes:
    try:
        text = canonical(entry)
    except (UnicodeEncodeError, ValueError):
        form = 1
    if form == 1:  # the same value, other bytes: escaped non-ASCII, spaces
        return json.dumps(entry, ensure_ascii=True).encode()
    if form == 2:  # whitespace json.loads skips
        return b" " + text + b"\r"
    if form == 3:
        return b"\xef\xbb\xbf" + text  # a UTF-8 BOM, which json.loads accepts on bytes
    return text


# One record: stream, business fields, header values, redacted?, byte form of the line.
record_specs = st.tuples(
    st.integers(0, 2),
    st.dictionaries(strings, json_values, max_size=3),
    st.one_of(st.none(), st.integers(0, 50), scalars),
    st.one_of(st.floats(1e9, 2e9), scalars),
    st.one_of(st.just("STEP_COMMITTED"), strings, scalars),
    st.booleans(),
    st.sampled_from([0, 0, 0, 0, 0, 1, 2, 3]),
)


def _build(specs: list[tuple], first: int) -> list[bytes]:
    heads: dict[str, tuple[int, str]] = {}
    lines = []
    for i, (s, business, seq, ts, event, redact, form) in enumerate(specs):
        stream = ["agent-a", 'ag"ent\\é', "server"][s]
        position, prev = heads.get(stream, (0, GENESIS))
        record = {**business, "seq": seq, "ts": ts, "event": event}
        head = _stamped(record, prev)
        if redact:
            record = redact_record(record)
        heads[stream] = (position + 1, head)
        entry = {"leaf_index": first + i, "stream": stream, "position": position + 1, "record": record}
        lines.append(_line(entry, form))
    return lines


def _tamper(lines: list[bytes], how: int, a: int, b: int, byte: bytes) -> list[bytes]:
    out = list(lines)
    if not out:
        return out
    a %= len(out)
    b %= len(out)
    if how == 1:
        del out[a]
    elif how == 2:
        out[a], out[b] = out[b], out[a]
    elif how == 3:
        out.insert(b, out[a])
    elif how == 4:
        k = b % (len(out[a]) or 1)
        out[a] = out[a][:k] + byte + out[a][k + 1 :]
    elif how == 5:  # a record that claims redaction but keeps its payload
        out[a] = out[a].replace(b'"_h":', b'"_redacted":"x","_h":', 1)
    elif how == 6:  # something after the value
        out[a] = out[a] + byte + (out[b] if byte != b"\n" else b"")
    elif how == 7:  # one value over two lines (whitespace json accepts), or a line cut in two
        k = out[a].find(b",", b % (len(out[a]) or 1))
        out[a] = out[a][: k + 1] + b"\n" + out[a][k + 1 :] if k >= 0 else out[a] + b"\n"
    return out


def _prefix(first: int) -> merkle.CompactRange:
    rng = random.Random(first)
    return merkle.MemoryTree(rng.randbytes(32) for _ in range(first)).compact_range()


def _reference(raw: bytes, first: int, count: int) -> tuple:
    leaves, heads, redacted = export._check_records_slow(raw, first, count)
    compact = _prefix(first)
    compact.extend(leaves)
    return compact.size, compact.root(), heads, redacted


def _fast(raw: bytes, first: int, count: int, workers: int) -> tuple:
    compact, heads, redacted = export._check_records(raw, first, count, _prefix(first), workers)
    return compact.size, compact.root(), heads, redacted


def _raw(lines: list[bytes], trailing_newline: bool) -> bytes:
    return b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")


tampers = st.tuples(
    st.sampled_from([0, 0, 1, 2, 3, 4, 4, 4, 5, 6, 7]),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.sampled_from([b"0", b"1", b"a", b'"', b"\\", b" ", b"\n", b"\xff", b"\x00", b"}"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(record_specs, max_size=12),
    first=st.sampled_from([0, 1, 5, 8, 1000]),
    tamper=tampers,
    trailing_newline=st.booleans(),
)
def test_fast_records_check_equals_reference(
    specs: list[tuple], first: int, tamper: tuple, trailing_newline: bool
) -> None:
    raw = _raw(_tamper(_build(specs, first), *tamper), trailing_newline)
    count = export._line_count(raw)
    assert _outcome(lambda: _fast(raw, first, count, 1)) == _outcome(lambda: _reference(raw, first, count))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(record_specs, min_size=2, max_size=40),
    first=st.sampled_from([0, 3, 64]),
    tamper=tampers,
)
def test_two_process_check_equals_reference(specs: list[tuple], first: int, tamper: tuple) -> None:
    raw = _raw(_tamper(_build(specs, first), *tamper), True)
    count = export._line_count(raw)
    assert _outcome(lambda: _fast(raw, first, count, 2)) == _outcome(lambda: _reference(raw, first, count))


def _clean_lines(n: int, first: int = 0, streams: int = 3) -> list[bytes]:
    heads: dict[str, tuple[int, str]] = {}
    lines = []
    for i in range(n):
        stream = f"agent-{i % streams}"
        position, prev = heads.get(stream, (0, GENESIS))
        record = {"seq": position + 1, "ts": 1.7e9 + i / 7, "event": "STEP_COMMITTED", "tool": "t", "i": i}
        if i % 5 == 0:
            record["kwargs"] = {"note": 'café ✓ "q" \\', "amount": i}
        heads[stream] = (position + 1, stamp(record, prev, salt=f"{i:032x}"))
        if i % 11 == 7:
            record = redact_record(record)
        entry = {"leaf_index": first + i, "stream": stream, "position": position + 1, "record": record}
        lines.append(canonical(entry))
    return lines


def test_clean_export_never_leaves_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw(_clean_lines(300, 5), True)

    def refuse(*args: Any) -> Any:
        raise AssertionError("fell back to the reference check")

    monkeypatch.setattr(export, "_check_line", refuse)
    monkeypatch.setattr(export, "_check_records_slow", refuse)
    fast = _fast(raw, 5, 300, 1)
    assert fast[3] == len(range(7, 300, 11))
    monkeypatch.undo()
    assert fast == _reference(raw, 5, 300)


def test_two_processes_split_the_work_and_agree() -> None:
    raw = _raw(_clean_lines(400), True)
    mid_byte = raw.find(b"\n", len(raw) // 2) + 1
    mid_line = raw.count(b"\n", 0, mid_byte)
    compact = _prefix(0)
    done = export._check_records_parallel(
        raw, raw[:mid_byte].decode(), mid_byte, mid_line, 0, 400, compact.size, list(compact.hashes)
    )
    assert done is not None  # the child's half was accepted, not re-checked in order
    assert (done[0].size, done[0].root(), done[1], done[2]) == _reference(raw, 0, 400)


@pytest.mark.parametrize("where", ["before", "at", "after"])
def test_two_processes_report_the_first_failure(where: str) -> None:
    lines = _clean_lines(400)
    raw = _raw(lines, True)
    mid_line = raw.count(b"\n", 0, raw.find(b"\n", len(raw) * 47 // 100) + 1)
    bad = {"before": 10, "at": mid_line, "after": 390}[where]
    lines[bad] = lines[bad].replace(b'"tool":"t"', b'"tool":"T"')
    lines[395] = lines[395].replace(b'"i":', b'"i":1', 1)  # a later failure must not win
    raw = _raw(lines, True)
    expected = _outcome(lambda: _reference(raw, 0, 400))
    assert expected[0] == "VerificationError" and f"line {bad + 1} " in expected[1]
    assert _outcome(lambda: _fast(raw, 0, 400, 2)) == expected


def test_broken_link_across_the_cut_is_refused() -> None:
    lines = _clean_lines(400, streams=1)
    raw = _raw(lines, True)
    mid_line = raw.count(b"\n", 0, raw.find(b"\n", len(raw) * 47 // 100) + 1)
    # Drop the first record after the cut and renumber leaf indices and positions: every record
    # still checks on its own, only the link across the cut is broken.
    del lines[mid_line]
    for i in range(mid_line, len(lines)):
        entry = json.loads(lines[i])
        lines[i] = canonical({**entry, "leaf_index": i, "position": entry["position"] - 1})
    raw = _raw(lines, True)
    expected = _outcome(lambda: _reference(raw, 0, 399))
    assert expected[0] == "VerificationError" and "does not link" in expected[1]
    assert _outcome(lambda: _fast(raw, 0, 399, 2)) == expected


@settings(max_examples=200, deadline=None)
@given(begin=st.integers(0, 3000), count=st.integers(0, 300))
def test_subtree_append_equals_leaf_by_leaf(begin: int, count: int) -> None:
    rng = random.Random(begin * 7919 + count)
    leaves = [rng.randbytes(32) for _ in range(count)]
    reference = _prefix(begin)
    reference.extend(leaves)
    prefix = _prefix(begin)
    size, stack = prefix.size, list(prefix.hashes)
    for level, node in export._subtrees(begin, leaves):
        assert size % (1 << level) == 0
        size, stack = export._append(size, stack, [node], level)
    assert (size, stack) == (reference.size, list(reference.hashes))


# --------------------------------------------------------------------------- whole bundle


def _bundle(n: int) -> tuple[dict[str, bytes], str]:
    signer = note.generate_signer("test.example/log")
    lines = _clean_lines(n)
    compact = merkle.CompactRange()
    for line in lines:
        entry = json.loads(line)
        compact.append(merkle.leaf_hash(leaf_data(entry["stream"], entry["position"], entry["record"]["_h"])))
    raw = _raw(lines, True)
    heads = {}
    for line in lines:
        entry = json.loads(line)
        heads[entry["stream"]] = {"position": entry["position"], "hash": entry["record"]["_h"]}
    cp = note.sign_note(note.format_checkpoint("test.example/log", n, compact.root()), signer)
    manifest = {
        "format": export.FORMAT,
        "origin": "test.example/log",
        "first": 0,
        "end": n,
        "record_count": n,
        "checkpoint": cp,
        "prefix_frontier": [],
        "end_consistency": [],
        "previous": None,
        "records_sha256": hashlib.sha256(raw).hexdigest(),
        "stream_heads": heads,
    }
    files = {"records.ndjson": raw, "manifest.json": json.dumps(manifest).encode(), "checkpoint": cp.encode()}
    return files, signer.verifier_key


@pytest.mark.parametrize("workers", [1, 2])
def test_whole_bundle_verifies_and_tampering_is_refused(workers: int) -> None:
    files, key = _bundle(500)
    report = export.verify_export_files(files, key, workers=workers)
    assert (report.records, report.redacted) == (500, len(range(7, 500, 11)))
    manifest = json.loads(files["manifest.json"])
    lines = files["records.ndjson"].split(b"\n")
    lines[321] = lines[321].replace(b'"tool":"t"', b'"tool":"u"')
    raw = b"\n".join(lines)
    manifest["records_sha256"] = hashlib.sha256(raw).hexdigest()
    tampered = {**files, "records.ndjson": raw, "manifest.json": json.dumps(manifest).encode()}
    with pytest.raises(VerificationError, match=r"line 322 \(leaf 321\): payload does not match"):
        export.verify_export_files(tampered, key, workers=workers)
    manifest = json.loads(files["manifest.json"])
    manifest["stream_heads"]["agent-0"]["position"] += 1
    with pytest.raises(VerificationError, match="stream_heads"):
        export.verify_export_files({**files, "manifest.json": json.dumps(manifest).encode()}, key)


def test_auto_workers_stays_in_process_for_small_exports() -> None:
    assert export._auto_workers(export.PARALLEL_MIN_RECORDS - 1) == 1
