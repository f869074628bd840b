"""Offline verification of a WORM export (``sagaplane verify-export``).

An export is a tar.gz (or the unpacked folder) holding ``records.ndjson`` (one JSON object per
leaf, in leaf order: ``leaf_index``, ``stream``, ``position``, ``record``), ``manifest.json`` and
``checkpoint`` (the signed note). :data:`RULE` is the rule in prose; it is also written into
every manifest so the bundle explains itself years later. Standard library only, except the
Ed25519 signature check (the ``cryptography`` extra). Hashes are base64.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import multiprocessing
import os
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import merkle, note
from .chain import HASH_FIELD, PREV_FIELD, REDACTED_FIELD, record_hash
from .disclosure import VerificationError, check_location, check_record, open_signed, record_leaf_hash, unb64

FORMAT = "sagaplane-export/1"
FILES = ("records.ndjson", "manifest.json", "checkpoint")

RULE = (
    "1. sha256sum records.ndjson must equal manifest.records_sha256, and the file `checkpoint` must equal "
    "manifest.checkpoint. 2. The checkpoint is a C2SP signed note; verify it with the tenant's verifier key "
    "(Ed25519); its origin must be manifest.origin. 3. records.ndjson has manifest.record_count lines, "
    "line i holding leaf manifest.first + i; each line is {leaf_index, stream, position, record}. "
    "4. For each record: unless redacted, SHA-256(_s || canonical(business fields)) = _cd; "
    "_h = SHA-256(canonical({prev:_ph, seq, ts, event, cd:_cd})); records of one stream at consecutive "
    "positions link (_ph = the earlier _h). 5. Leaf hash = SHA-256(0x00 || canonical({v:1, stream, "
    "pos:position, h:_h})); starting from manifest.prefix_frontier (the RFC 9162 compact range of the "
    "first manifest.first leaves) append every leaf hash; the resulting root of manifest.end leaves must "
    "equal the checkpoint root when end equals the checkpoint size, or be proven consistent with it by "
    "manifest.end_consistency (RFC 9162). 6. manifest.stream_heads name the last position and _h of each "
    "stream in the file. 7. If manifest.previous is present, its checkpoint must verify with the key and "
    "manifest.previous.consistency must prove it consistent with this checkpoint (RFC 9162)."
)


@dataclass(frozen=True)
class ExportReport:
    origin: str
    first: int
    end: int
    size: int
    records: int
    redacted: int
    previous_size: int | None

    def summary(self) -> str:
        prev = (
            f"; consistent with the previous export at size {self.previous_size}"
            if self.previous_size
            else ""
        )
        red = f" ({self.redacted} redacted)" if self.redacted else ""
        return (
            f"{self.records} record(s){red}, leaves {self.first}..{self.end - 1}, chains intact, all in "
            f"{self.origin} at size {self.size}{prev}"
        )


def _open_tar(path: str) -> tarfile.TarFile:
    """tarfile.open(path, "r:*"); a .tar.gz is gunzipped in one call rather than streamed through
    GzipFile in small reads (the same bytes, several times faster). Anything else, or anything
    that plain "r:*" might read differently (not gzip, a plain tar, a bad gzip), takes "r:*"."""
    with open(path, "rb") as fh:
        blob = fh.read()
    if blob[:2] == b"\x1f\x8b":
        try:
            tarfile.open(fileobj=io.BytesIO(blob), mode="r:").close()  # "r:*" tries plain tar first
        except tarfile.TarError:
            try:
                data = gzip.decompress(blob)
            except (OSError, EOFError, zlib.error):
                pass
            else:
                return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    return tarfile.open(fileobj=io.BytesIO(blob), mode="r:*")


def read_bundle(path: str) -> dict[str, bytes]:
    """The three files from a tar.gz or a folder."""
    out: dict[str, bytes] = {}
    try:
        if os.path.isdir(path):
            for name in FILES:
                with open(os.path.join(path, name), "rb") as fh:
                    out[name] = fh.read()
        else:
            with _open_tar(path) as tar:
                for member in tar.getmembers():
                    base = member.name.rsplit("/", 1)[-1]
                    if base in FILES and member.isfile():
                        extracted = tar.extractfile(member)
                        if extracted is not None:
                            out[base] = extracted.read()
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise VerificationError(f"cannot read {path}: {exc}") from None
    for name in FILES:
        if name not in out:
            raise VerificationError(f"{name} is missing from the export")
    return out


def _int(manifest: dict, name: str) -> int:
    value = manifest.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise VerificationError(f"manifest.{name} is not a non-negative integer")
    return value


# --------------------------------------------------------------------------- records.ndjson checks
#
# Step 4-5 of RULE for every line. `_check_records_slow` is the reference: the rule written out
# with the shared helpers (json.loads, check_record, record_leaf_hash). `_check_records` is the
# same computation with the per-record overhead removed; whenever its fast path meets anything
# it has not proven identical (a line it cannot parse in one scan, an odd type, a failed check)
# it hands that line to the reference code, so a refusal always carries the reference's reason
# and anything the fast path accepts the reference accepts too (tests/sdk/test_sdk_chain_export.py).

_Heads = dict[str, tuple[int, str]]


def _line_count(raw: bytes) -> int:
    """Lines as `raw.split(b"\n")` minus one empty last element counts them."""
    if not raw:
        return 0
    return raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)


def _check_line(line: bytes, i: int, expected_index: int) -> tuple[bytes, str, int, dict[str, Any]]:
    """Reference check of one line: parse, leaf index, record, leaf hash (not the link)."""
    try:
        entry = json.loads(line)
    except ValueError:
        raise VerificationError(f"line {i + 1} of records.ndjson is not JSON") from None
    if not isinstance(entry, dict) or entry.get("leaf_index") != expected_index:
        got = entry.get("leaf_index") if isinstance(entry, dict) else None
        raise VerificationError(
            f"line {i + 1}: leaf index {got}, expected {expected_index} (records missing, added or reordered)"
        )
    record, stream, position = entry.get("record"), entry.get("stream"), entry.get("position")
    try:
        record = check_record(record)
    except VerificationError as exc:
        raise VerificationError(f"line {i + 1} (leaf {expected_index}): {exc}") from None
    stream, position = check_location(stream, position)
    return record_leaf_hash(stream, position, record), stream, position, record


def _link_error(i: int, expected_index: int, stream: str) -> VerificationError:
    return VerificationError(
        f"line {i + 1} (leaf {expected_index}) does not link to the previous record of {stream}"
    )


def _check_records_slow(raw: bytes, first: int, count: int) -> tuple[list[bytes], _Heads, int]:
    """The reference loop: (leaf hashes, stream heads, redacted count) or VerificationError."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) != count:
        raise VerificationError(f"records.ndjson has {len(lines)} line(s), manifest says {count}")
    heads: _Heads = {}
    redacted = 0
    leaf_hashes: list[bytes] = []
    for i, line in enumerate(lines):
        expected_index = first + i
        leaf, stream, position, record = _check_line(line, i, expected_index)
        leaf_hashes.append(leaf)
        if record.get(REDACTED_FIELD):
            redacted += 1
        head = heads.get(stream)
        if head is not None and position == head[0] + 1 and record[PREV_FIELD] != head[1]:
            raise _link_error(i, expected_index, stream)
        heads[stream] = (position, record[HASH_FIELD])
    return leaf_hashes, heads, redacted


class _Slow(Exception):
    """The fast path has not proven this line; the reference code decides it."""


_MISSING = object()
# scan_once and c_make_encoder are CPython's json internals, which typeshed does not declare.
# What json.loads runs, minus its per-call wrapping:
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_encode_str = json.encoder.encode_basestring  # json.dumps(ensure_ascii=False)'s string form
# canonical() = JSONEncoder(sort_keys, (",", ":"), ensure_ascii=False, default=str).encode; this is
# the C encoder that call builds, built once. No circular-reference markers: values parsed from
# JSON cannot be circular.
_EncoderFactory = Callable[..., Callable[[Any, int], list[str]]]
_c_encoder: _EncoderFactory | None = json.encoder.c_make_encoder  # type: ignore[attr-defined]
_encode_business = (
    _c_encoder(None, str, _encode_str, None, ":", ",", True, False, True) if _c_encoder is not None else None
)


@dataclass
class _Chunk:
    """What checking lines [start, stop) found, with no knowledge of the lines before `start`."""

    leaves: list[bytes]
    heads: _Heads
    # stream -> (position, _ph) of its first record in the chunk: the link to check against
    # the previous chunk's head of that stream.
    firsts: dict[str, tuple[int, str]]
    redacted: int


def _scan_lines(text: str, pos: int, start: int, stop: int, first: int, heads: _Heads) -> _Chunk:
    """Lines start..stop-1 of records.ndjson; `text` is the file decoded from line `start` on
    (UTF-8 with surrogatepass, as json.loads decodes a line) and `pos` where line `start` begins.
    `heads` are the stream heads before line `start` (updated in place). Raises
    VerificationError for the first line that fails, with the reference reason."""
    sha256 = hashlib.sha256
    scan, find, enc, business_enc = _scan, text.find, _encode_str, _encode_business
    assert business_enc is not None, "callers take the reference path without the C encoder"
    missing = _MISSING
    suffixes: dict[str, str] = {}
    leaves: list[bytes] = []
    append = leaves.append
    firsts: dict[str, tuple[int, str]] = {}
    redacted = 0
    size = len(text)
    for i in range(start, stop):
        nl = find("\n", pos)
        if nl < 0:
            nl = size
        try:
            # One scan from the line's first byte that ends exactly at its newline parses the
            # same value json.loads(line) does (no BOM, no leading/trailing whitespace, no NUL).
            entry, end = scan(text, pos)
            if end != nl or type(entry) is not dict or entry.get("leaf_index") != first + i:
                raise _Slow
            record = entry.get("record")
            stream = entry.get("stream")
            position = entry.get("position")
            if type(record) is not dict or type(stream) is not str or type(position) is not int:
                raise _Slow
            # check_record, on a record we own: pop the meta and header fields, leaving exactly
            # business_fields(record).
            pop = record.pop
            h = pop("_h", None)
            cd = pop("_cd", None)
            ph = pop("_ph", None)
            if type(h) is not str or type(cd) is not str or type(ph) is not str:
                raise _Slow
            salt = pop("_s", missing)
            red = pop("_redacted", None)
            seq = pop("seq", None)
            ts = pop("ts", None)
            event = pop("event", "")
            if red:
                if record or salt is not missing:
                    raise _Slow
            else:
                if type(salt) is not str:
                    raise _Slow
                body = "".join(business_enc(record, 0)).encode("utf-8")
                if sha256(salt.encode("ascii") + body).hexdigest() != cd:
                    raise _Slow
            tt = type(ts)
            if type(seq) is int and type(event) is str and (tt is int or (tt is float and ts - ts == 0.0)):
                # canonical({"prev", "seq", "ts", "event", "cd"}): sorted keys, ints and finite
                # floats by repr, strings by json's own encoder.
                pre = f'{{"cd":{enc(cd)},"event":{enc(event)},"prev":{enc(ph)},"seq":{seq!r},"ts":{ts!r}}}'
                if sha256(pre.encode("utf-8")).hexdigest() != h:
                    raise _Slow
            elif record_hash(ph, seq, ts, event, cd) != h:
                raise _Slow
            # h now equals a lowercase hex digest, so it needs no escaping in the leaf data.
            suffix = suffixes.get(stream) or suffixes.setdefault(stream, f',"stream":{enc(stream)},"v":1}}')
            leaf = sha256(f'\x00{{"h":"{h}","pos":{position!r}{suffix}'.encode()).digest()
        except Exception:
            # Not proven here (or a check failed): the reference code decides this line, and
            # raises exactly what it raises.
            line = text[pos:nl].encode("utf-8", "surrogatepass")
            leaf, stream, position, full = _check_line(line, i, first + i)
            red, h, ph = full.get(REDACTED_FIELD), full[HASH_FIELD], full[PREV_FIELD]
        append(leaf)
        redacted += 1 if red else 0
        head = heads.get(stream)
        if head is None:
            firsts[stream] = (position, ph)
        elif position == head[0] + 1 and ph != head[1]:
            raise _link_error(i, first + i, stream)
        heads[stream] = (position, h)
        pos = nl + 1
    return _Chunk(leaves, heads, firsts, redacted)


# Below this many records a second process costs more than it saves.
PARALLEL_MIN_RECORDS = 20_000


def _auto_workers(count: int) -> int:
    """2 when the export is large, the machine has two CPUs for us, and forking is safe (a
    single-threaded process on a platform with fork); otherwise 1."""
    if count < PARALLEL_MIN_RECORDS or threading.active_count() != 1:
        return 1
    if multiprocessing.current_process().daemon:
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return 2 if cpus >= 2 else 1


def _decode(raw: bytes, start: int = 0, stop: int | None = None) -> str:
    # What json.loads does to each line's bytes; splitting at a newline never cuts a character.
    return str(memoryview(raw)[start:stop], "utf-8", "surrogatepass")


def _child(raw: bytes, byte_start: int, line_start: int, count: int, first: int, conn: Any) -> None:
    """Second process: lines line_start..count-1, knowing nothing of the heads before them.
    It sends the Merkle subtrees its leaves form rather than the leaves."""
    try:
        chunk = _scan_lines(_decode(raw, byte_start), 0, line_start, count, first, {})
        subtrees = _subtrees(first + line_start, chunk.leaves)
        conn.send((subtrees, chunk.heads, chunk.firsts, chunk.redacted))
    except BaseException:  # noqa: BLE001 - any failure: the parent re-checks in order
        conn.send(None)
    finally:
        conn.close()


def _subtrees(begin: int, leaves: list[bytes]) -> list[tuple[int, bytes]]:
    """The aligned perfect subtrees covering leaves [begin, begin + len(leaves)), left to right,
    as (level, hash): appended in order to a compact range of size `begin` they give the same
    range as appending the leaves one by one."""
    out: list[tuple[int, bytes]] = []
    pos, end, k = begin, begin + len(leaves), 0
    while pos < end:
        level = (pos & -pos).bit_length() - 1 if pos else 64
        while pos + (1 << level) > end:
            level -= 1
        width = 1 << level
        out.append((level, _append(0, [], leaves[k : k + width], 0)[1][0]))
        pos += width
        k += width
    return out


def _append(size: int, stack: list[bytes], hashes: list[bytes], level: int) -> tuple[int, list[bytes]]:
    """Append perfect subtrees of one `level` (0: leaf hashes) to the compact range (size, stack),
    as CompactRange.append does for leaves: each trailing 1-bit of the count is a pending left
    sibling of equal height. `size` must be a multiple of 2**level."""
    sha256 = hashlib.sha256
    push, pop = stack.append, stack.pop
    step = 1 << level
    for cur in hashes:
        if len(cur) != merkle.HASH_SIZE:
            raise merkle.TreeRangeError("leaf hash must be 32 bytes")
        n = size >> level
        while n & 1:
            cur = sha256(b"\x01" + pop() + cur).digest()
            n >>= 1
        push(cur)
        size += step
    return size, stack


def _check_records(
    raw: bytes, first: int, count: int, compact: merkle.CompactRange, workers: int = 1
) -> tuple[merkle.CompactRange, _Heads, int]:
    """`compact` extended with every leaf hash, the stream heads and the redacted count; or the
    same first VerificationError as `_check_records_slow` (whose line count the caller has
    already checked)."""
    size, stack = compact.size, list(compact.hashes)
    if _encode_business is not None and workers >= 2 and count >= 2:
        # Two parts split at a line boundary: this process checks the first with the real heads
        # while a forked child checks the rest from scratch; then the links across the cut.
        mid_byte = raw.find(b"\n", len(raw) * 47 // 100) + 1
        mid_line = raw.count(b"\n", 0, mid_byte)
        if mid_byte > 0 and 0 < mid_line < count:
            try:
                head_text = _decode(raw, 0, mid_byte)
            except UnicodeDecodeError:
                head_text = None
            if head_text is not None:
                done = _check_records_parallel(raw, head_text, mid_byte, mid_line, first, count, size, stack)
                if done is not None:
                    return done
                # The second part has a bad line or link (or could not run): check all in order.
                return _check_records(raw, first, count, compact, 1)
    try:
        if _encode_business is None:  # no C accelerator: nothing here beats the reference loop
            raise UnicodeDecodeError("utf-8", b"", 0, 0, "no _json")
        text = _decode(raw)
    except UnicodeDecodeError:
        leaves, heads, redacted = _check_records_slow(raw, first, count)
    else:
        chunk = _scan_lines(text, 0, 0, count, first, {})
        leaves, heads, redacted = chunk.leaves, chunk.heads, chunk.redacted
    size, stack = _append(size, stack, leaves, 0)
    return merkle.CompactRange(size, stack), heads, redacted


def _check_records_parallel(
    raw: bytes, head_text: str, mid_byte: int, mid_line: int, first: int, count: int, size: int, stack: list
) -> tuple[merkle.CompactRange, _Heads, int] | None:
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(raw, mid_byte, mid_line, count, first, sender), daemon=True)
    try:
        proc.start()
    except (AssertionError, OSError):  # a daemonic process may not fork children; out of processes
        receiver.close()
        sender.close()
        return None
    sender.close()
    try:
        chunk = _scan_lines(head_text, 0, 0, mid_line, first, {})
        size, stack = _append(size, stack, chunk.leaves, 0)
        try:
            result = receiver.recv()
        except EOFError:
            result = None
        proc.join()
    finally:
        receiver.close()
        if proc.is_alive():  # the first part failed: the second part's answer no longer matters
            proc.terminate()
            proc.join()
    if result is None:
        return None
    subtrees, tail_heads, tail_firsts, tail_redacted = result
    heads = chunk.heads
    for stream, (position, ph) in tail_firsts.items():
        head = heads.get(stream)
        if head is not None and position == head[0] + 1 and ph != head[1]:
            return None
    heads.update(tail_heads)
    for level, node in subtrees:
        size, stack = _append(size, stack, [node], level)
    if size != first + count:
        return None
    return merkle.CompactRange(size, stack), heads, chunk.redacted + tail_redacted


def _previous_size(
    manifest: dict[str, Any], cp: note.Checkpoint, key_list: list[str | note.Verifier]
) -> int | None:
    """The size of the previous export's checkpoint the manifest names (None: it names none), once
    `cp` is proven consistent with it."""
    previous = manifest.get("previous")
    if previous is None:
        return None
    if not isinstance(previous, dict):
        raise VerificationError("manifest.previous is malformed")
    prev_cp = open_signed(previous.get("checkpoint"), key_list, manifest.get("origin"))
    try:
        if prev_cp.size == cp.size:
            if prev_cp.root_hash != cp.root_hash:
                raise merkle.ProofError("same size, different root")
        elif prev_cp.size > 0:
            proof = [unb64(h, "previous consistency hash") for h in previous.get("consistency") or []]
            merkle.verify_consistency(prev_cp.size, cp.size, proof, prev_cp.root_hash, cp.root_hash)
    except merkle.ProofError as exc:
        raise VerificationError(
            f"this checkpoint is not consistent with the previous export's (size {prev_cp.size}): {exc}"
        ) from None
    return int(prev_cp.size)


def verify_export_files(
    files: dict[str, bytes],
    keys: str | note.Verifier | Iterable[str | note.Verifier],
    *,
    workers: int | None = None,
) -> ExportReport:
    """`workers`: processes checking records.ndjson (None: 2 for a large export when safe)."""
    key_list = [keys] if isinstance(keys, str | note.Verifier) else list(keys)
    try:
        manifest = json.loads(files["manifest.json"])
    except ValueError:
        raise VerificationError("manifest.json is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise VerificationError(f"manifest.json is not a {FORMAT} manifest")
    raw = files["records.ndjson"]
    if hashlib.sha256(raw).hexdigest() != manifest.get("records_sha256"):
        raise VerificationError(
            "records.ndjson does not match the SHA-256 in manifest.json (altered or truncated)"
        )
    checkpoint_text = files["checkpoint"].decode("utf-8", "replace")
    if checkpoint_text != manifest.get("checkpoint"):
        raise VerificationError("the checkpoint file differs from the checkpoint in manifest.json")
    cp = open_signed(checkpoint_text, key_list, manifest.get("origin"))
    first, end, count = _int(manifest, "first"), _int(manifest, "end"), _int(manifest, "record_count")
    if end - first != count:
        raise VerificationError(f"manifest range [{first}, {end}) does not hold record_count {count} records")
    if end > cp.size:
        raise VerificationError(
            f"the records reach leaf {end - 1}, beyond the checkpoint (size {cp.size}): "
            "an older checkpoint, or records that are not in the log"
        )

    frontier_raw = manifest.get("prefix_frontier")
    if not isinstance(frontier_raw, list):
        raise VerificationError("manifest.prefix_frontier is missing")
    try:
        compact = merkle.CompactRange(first, [unb64(h, "prefix_frontier hash") for h in frontier_raw])
    except merkle.MerkleError as exc:
        raise VerificationError(f"manifest.prefix_frontier is malformed: {exc}") from None

    n_lines = _line_count(raw)
    if n_lines != count:
        raise VerificationError(f"records.ndjson has {n_lines} line(s), manifest says {count}")
    if workers is None:
        workers = _auto_workers(count)
    compact, heads, redacted = _check_records(raw, first, count, compact, workers)
    root_end = compact.root()
    try:
        if end == cp.size:
            if root_end != cp.root_hash:
                raise merkle.ProofError("the records do not reproduce the checkpoint root")
        else:
            proof = [unb64(h, "end_consistency hash") for h in manifest.get("end_consistency") or []]
            merkle.verify_consistency(end, cp.size, proof, root_end, cp.root_hash)
    except merkle.ProofError as exc:
        raise VerificationError(f"the records are not the log's leaves {first}..{end - 1}: {exc}") from None

    declared = manifest.get("stream_heads")
    actual = {s: {"position": p, "hash": h} for s, (p, h) in heads.items()}
    if declared != actual:
        raise VerificationError("manifest.stream_heads do not match the last record of each stream")

    previous_size = _previous_size(manifest, cp, key_list)
    return ExportReport(cp.origin, first, end, cp.size, count, redacted, previous_size)


def verify_export(
    path: str, keys: str | note.Verifier | Iterable[str | note.Verifier], *, workers: int | None = None
) -> ExportReport:
    """Return a report when everything holds; raise VerificationError naming the first failure."""
    return verify_export_files(read_bundle(path), keys, workers=workers)


def pack(files: dict[str, bytes], mtime: int = 0) -> bytes:
    """A deterministic tar.gz of the export files (fixed order, owner and mtime)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in FILES:
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mtime = mtime
            info.mode = 0o444
            tar.addfile(info, io.BytesIO(files[name]))
    return buffer.getvalue()


__all__ = [
    "FILES",
    "FORMAT",
    "RULE",
    "ExportReport",
    "pack",
    "read_bundle",
    "verify_export",
    "verify_export_files",
]
