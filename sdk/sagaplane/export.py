"""Offline verification of a WORM export (``sagaplane verify-export``).

An export is a tar.gz (or the unpacked folder) holding ``records.ndjson`` (one JSON object per
leaf, in leaf order: ``leaf_index``, ``stream``, ``position``, ``record``), ``manifest.json`` and
``checkpoint`` (the signed note). :data:`RULE` is the rule in prose; it is also written into
every manifest so the bundle explains itself years later. Standard library only, except the
Ed25519 signature check (the ``cryptography`` extra). Hashes are base64.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass

from . import merkle, note
from .chain import HASH_FIELD, PREV_FIELD
from .disclosure import VerificationError, check_record, open_signed, record_leaf_hash, unb64

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


def read_bundle(path: str) -> dict[str, bytes]:
    """The three files from a tar.gz or a folder."""
    out: dict[str, bytes] = {}
    try:
        if os.path.isdir(path):
            for name in FILES:
                with open(os.path.join(path, name), "rb") as fh:
                    out[name] = fh.read()
        else:
            with tarfile.open(path, "r:*") as tar:
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


def verify_export_files(
    files: dict[str, bytes], keys: str | note.Verifier | Iterable[str | note.Verifier]
) -> ExportReport:
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

    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) != count:
        raise VerificationError(f"records.ndjson has {len(lines)} line(s), manifest says {count}")
    heads: dict[str, tuple[int, str]] = {}
    redacted = 0
    leaf_hashes: list[bytes] = []
    for i, line in enumerate(lines):
        expected_index = first + i
        try:
            entry = json.loads(line)
        except ValueError:
            raise VerificationError(f"line {i + 1} of records.ndjson is not JSON") from None
        if not isinstance(entry, dict) or entry.get("leaf_index") != expected_index:
            got = entry.get("leaf_index") if isinstance(entry, dict) else None
            raise VerificationError(
                f"line {i + 1}: leaf index {got}, expected {expected_index} "
                "(records missing, added or reordered)"
            )
        record, stream, position = entry.get("record"), entry.get("stream"), entry.get("position")
        try:
            check_record(record)
        except VerificationError as exc:
            raise VerificationError(f"line {i + 1} (leaf {expected_index}): {exc}") from None
        leaf_hashes.append(record_leaf_hash(stream, position, record))
        if record.get("_redacted"):
            redacted += 1
        head = heads.get(stream)
        if head is not None and position == head[0] + 1 and record[PREV_FIELD] != head[1]:
            raise VerificationError(
                f"line {i + 1} (leaf {expected_index}) does not link to the previous record of {stream}"
            )
        heads[stream] = (position, record[HASH_FIELD])
    compact.extend(leaf_hashes)
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

    previous_size = None
    previous = manifest.get("previous")
    if previous is not None:
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
        previous_size = prev_cp.size
    return ExportReport(cp.origin, first, end, cp.size, count, redacted, previous_size)


def verify_export(path: str, keys: str | note.Verifier | Iterable[str | note.Verifier]) -> ExportReport:
    """Return a report when everything holds; raise VerificationError naming the first failure."""
    return verify_export_files(read_bundle(path), keys)


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
