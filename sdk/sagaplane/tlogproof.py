"""Offline proof files in the C2SP tlog-proof format (https://c2sp.org/tlog-proof, v1).

A proof file shows that one entry is in a transparency log, checkable with nothing but the
file, the entry and the log's verifier key. Format, as written and accepted here (lines end in
U+000A; base64 is standard RFC 4648 §4 with padding)::

    c2sp.org/tlog-proof@v1
    extra <base64>            (optional, opaque, NOT authenticated: never trusted here)
    index <N>                 (zero-based leaf index, decimal, no leading zeroes)
    <base64 hash>             (zero or more: the RFC 6962 inclusion proof, leaf's sibling first,
    <base64 hash>              one 32-byte SHA-256 hash per line)

    <the signed checkpoint note, verbatim (c2sp.org/tlog-checkpoint + signed-note)>

Files should carry the extension `.tlog-proof`. Sagaplane serves them at
`GET /api/v1/audit/proofs/bundle?index=N` against the latest signed checkpoint. The leaf hash
of a Sagaplane record is `SHA-256(0x00 || leaf_data(stream, position, _h))` (`sagaplane.leaf`).

Only the Ed25519 signature check needs `cryptography` (through `sagaplane.note`); parsing and
the Merkle check are standard library.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import merkle, note

__all__ = [
    "HEADER",
    "ProofFileError",
    "TlogProof",
    "VerifiedProof",
    "format_proof",
    "parse_proof",
    "parse_proof_file",
    "verify_proof",
    "verify_proof_file",
]

HEADER = "c2sp.org/tlog-proof@v1"
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)\Z")
_MAX_INDEX = (1 << 64) - 1
# A tree of 2^64 leaves needs at most 64 proof hashes; anything longer is not a proof.
_MAX_HASHES = 64


class ProofFileError(ValueError):
    """The proof file is malformed, or does not prove what it is asked to; says which."""


@dataclass(frozen=True)
class TlogProof:
    index: int
    hashes: tuple[bytes, ...]
    checkpoint: str  # the signed note, verbatim
    extra: bytes | None = None


@dataclass(frozen=True)
class VerifiedProof:
    index: int
    checkpoint: note.Checkpoint
    record: dict[str, Any] | None = None  # the record from the extra data, once proven included

    def summary(self) -> str:
        return (
            f"leaf {self.index} is in {self.checkpoint.origin} at size {self.checkpoint.size} "
            f"(root {base64.b64encode(self.checkpoint.root_hash).decode()})"
        )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: str, what: str) -> bytes:
    try:
        decoded = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ProofFileError(f"{what} is not standard base64: {value!r}") from exc
    if _b64(decoded) != value:  # one spelling per value (no missing padding, no stray bits)
        raise ProofFileError(f"{what} is not canonical base64: {value!r}")
    return decoded


def format_proof(
    index: int, hashes: Iterable[bytes], checkpoint_note: str, extra: bytes | None = None
) -> str:
    """The proof file text for leaf `index` with its inclusion proof against `checkpoint_note`."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= _MAX_INDEX:
        raise ProofFileError(f"index must be an int in [0, 2**64), got {index!r}")
    lines = [HEADER]
    if extra is not None:
        lines.append(f"extra {_b64(extra)}")
    lines.append(f"index {index}")
    for digest in hashes:
        if len(digest) != merkle.HASH_SIZE:
            raise ProofFileError(f"proof hashes are {merkle.HASH_SIZE} bytes, got {len(digest)}")
        lines.append(_b64(digest))
    if not checkpoint_note.endswith("\n"):
        raise ProofFileError("the checkpoint note must end with a newline")
    return "\n".join(lines) + "\n\n" + checkpoint_note


def parse_proof(text: str | bytes) -> TlogProof:
    """Parse a proof file strictly (no signature or Merkle check: see `verify_proof`)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProofFileError("a proof file is UTF-8 text") from exc
    head, sep, checkpoint = text.partition("\n\n")
    if not sep or not checkpoint:
        raise ProofFileError("no blank line followed by a checkpoint")
    lines = head.split("\n")
    if lines[0] != HEADER:
        raise ProofFileError(f"first line is not {HEADER!r}: {lines[0][:80]!r}")
    position = 1
    extra = None
    if position < len(lines) and lines[position].startswith("extra "):
        extra = _unb64(lines[position][len("extra ") :], "extra data")
        position += 1
    if position >= len(lines) or not lines[position].startswith("index "):
        raise ProofFileError("missing 'index N' line")
    raw_index = lines[position][len("index ") :]
    if not _DECIMAL.match(raw_index) or int(raw_index) > _MAX_INDEX:
        raise ProofFileError(f"index is not a canonical 64-bit decimal: {raw_index!r}")
    hashes = []
    for number, line in enumerate(lines[position + 1 :], start=1):
        digest = _unb64(line, f"proof hash {number}")
        if len(digest) != merkle.HASH_SIZE:
            raise ProofFileError(f"proof hash {number} is {len(digest)} bytes, not {merkle.HASH_SIZE}")
        hashes.append(digest)
    if len(hashes) > _MAX_HASHES:
        raise ProofFileError(f"{len(hashes)} proof hashes: no tree needs more than {_MAX_HASHES}")
    return TlogProof(int(raw_index), tuple(hashes), checkpoint, extra)


def verify_proof(
    text: str | bytes,
    verifier_keys: note.Verifier | str | Iterable[note.Verifier | str],
    *,
    leaf_hash: bytes | None = None,
    leaf_data: bytes | None = None,
    origin: str | None = None,
) -> VerifiedProof:
    """Check that the entry (its RFC 6962 `leaf_hash`, or its `leaf_data` to hash) is at the
    file's index in the tree of the checkpoint, and that the checkpoint is signed by one of
    `verifier_keys` (and, if given, has `origin`). Raises ProofFileError naming what fails.
    With neither, the leaf hash is computed from the record in the `extra` line (Sagaplane's
    bundles carry `{"stream", "position", "record"}` there): the extra data is not trusted as
    such, the inclusion proof is what then authenticates the record (`VerifiedProof.record`)."""
    if leaf_hash is not None and leaf_data is not None:
        raise ProofFileError("give at most one of leaf_hash and leaf_data")
    proof = parse_proof(text)
    record = None
    if leaf_data is not None:
        leaf_hash = merkle.leaf_hash(leaf_data)
    elif leaf_hash is None:
        leaf_hash, record = _leaf_from_extra(proof.extra)
    if len(leaf_hash) != merkle.HASH_SIZE:
        raise ProofFileError(f"leaf hash is {len(leaf_hash)} bytes, not {merkle.HASH_SIZE}")
    try:
        checkpoint = note.open_checkpoint(proof.checkpoint, verifier_keys, origin)
    except note.NoteError as exc:
        raise ProofFileError(f"checkpoint: {exc}") from exc
    if proof.index >= checkpoint.size:
        raise ProofFileError(f"index {proof.index} is beyond the checkpoint's {checkpoint.size} leaves")
    try:
        merkle.verify_inclusion(leaf_hash, proof.index, checkpoint.size, proof.hashes, checkpoint.root_hash)
    except merkle.MerkleError as exc:
        raise ProofFileError(f"inclusion proof of leaf {proof.index}: {exc}") from exc
    return VerifiedProof(proof.index, checkpoint, record)


def _leaf_from_extra(extra: bytes | None) -> tuple[bytes, dict[str, Any]]:
    """The leaf hash of the record a Sagaplane bundle carries as extra data, and the record."""
    from .disclosure import VerificationError, check_record, record_leaf_hash

    if extra is None:
        raise ProofFileError("the file carries no record (extra data): give the leaf hash")
    try:
        carried = json.loads(extra)
        record = check_record(carried["record"])
        return record_leaf_hash(carried["stream"], carried["position"], record), record
    except (ValueError, TypeError, KeyError, VerificationError) as exc:
        raise ProofFileError(f"the extra data is not a Sagaplane record: {exc}") from exc


def parse_proof_file(path: str) -> TlogProof:
    with open(path, "rb") as fh:
        return parse_proof(fh.read())


def verify_proof_file(
    path: str,
    verifier_keys: note.Verifier | str | Iterable[note.Verifier | str],
    *,
    leaf_hash: bytes | None = None,
    leaf_data: bytes | None = None,
    origin: str | None = None,
) -> VerifiedProof:
    with open(path, "rb") as fh:
        return verify_proof(fh.read(), verifier_keys, leaf_hash=leaf_hash, leaf_data=leaf_data, origin=origin)
