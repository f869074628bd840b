"""Offline verification of a saga disclosure (``sagaplane verify-disclosure``).

A disclosure is one saga's records, each with an RFC 9162 inclusion proof, the tenant's signed
C2SP checkpoint, and the saga seal: a record the server appended to its own stream when the
saga ended, listing the leaf index and ``_h`` of every record of the saga. The verifier checks
the signature, every record's digest and chain hash, every inclusion proof, chain links between
neighbouring records of a stream, and that the records are *exactly* the sealed ones, so an
omitted, added, altered or reordered record is named.

Standard library only, except the Ed25519 signature check (the ``cryptography`` extra).
Hashes in the bundle are base64 (standard alphabet, padded), as in C2SP checkpoints and proofs.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import merkle, note
from .chain import (
    DIGEST_FIELD,
    HASH_FIELD,
    PREV_FIELD,
    REDACTED_FIELD,
    SALT_FIELD,
    business_fields,
    content_digest,
    record_hash,
)
from .events import Event
from .leaf import leaf_data

FORMAT = "sagaplane-disclosure/1"
SEAL_EVENT = Event.SAGA_SEALED

RULE = (
    "Verify the checkpoint note with the tenant's verifier key (C2SP signed-note, Ed25519; its origin "
    "is the log). For each record and for the seal: if it is not redacted, SHA-256(_s || canonical("
    "business fields)) must equal _cd; _h must equal SHA-256(canonical({prev:_ph, seq, ts, event, "
    "cd:_cd})); the leaf hash SHA-256(0x00 || canonical({v:1, stream, pos:position, h:_h})) with the "
    "given inclusion proof must reproduce the checkpoint's root at its size (RFC 9162). Records are in "
    "increasing leaf order; two records of one stream at consecutive positions must link (_ph = _h of "
    "the earlier). The seal (event SAGA_SEALED, in the server stream, after every record) lists "
    "[leaf index, _h] of every record of the saga: the disclosed records must be exactly that list, "
    "and every unredacted record must carry the saga's saga_id."
)


class VerificationError(ValueError):
    """The first thing that does not hold, in words."""


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def unb64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise VerificationError(f"{what} is not a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise VerificationError(f"{what} is not valid base64") from None


def check_record(record: Any) -> dict[str, Any]:
    """A record's own digest and chain hash (ARCHITECTURE §3); redacted stubs keep the hash.
    Returns the record, now known to be a JSON object."""
    if not isinstance(record, dict):
        raise VerificationError("record is not a JSON object")
    for name in (HASH_FIELD, DIGEST_FIELD, PREV_FIELD):
        if not isinstance(record.get(name), str):
            raise VerificationError(f"record has no {name}")
    if record.get(REDACTED_FIELD):
        if business_fields(record) or SALT_FIELD in record:
            raise VerificationError("redacted record still carries payload or salt")
    else:
        salt = record.get(SALT_FIELD)
        if not isinstance(salt, str):
            raise VerificationError("record has no salt but is not marked redacted")
        try:
            digest = content_digest(business_fields(record), salt)
        except UnicodeEncodeError:
            digest = ""
        if digest != record[DIGEST_FIELD]:
            raise VerificationError("payload does not match its content digest _cd (a field was altered)")
    expected = record_hash(
        record[PREV_FIELD], record.get("seq"), record.get("ts"), record.get("event", ""), record[DIGEST_FIELD]
    )
    if expected != record[HASH_FIELD]:
        raise VerificationError("record hash _h does not match the record (a header or link was altered)")
    return record


def check_location(stream: Any, position: Any) -> tuple[str, int]:
    """An entry's stream and position, checked to be a string and an integer."""
    if not isinstance(stream, str) or not isinstance(position, int) or isinstance(position, bool):
        raise VerificationError("entry needs a string stream and an integer position")
    return stream, position


def record_leaf_hash(stream: Any, position: Any, record: dict[str, Any]) -> bytes:
    stream, position = check_location(stream, position)
    return merkle.leaf_hash(leaf_data(stream, position, record[HASH_FIELD]))


def open_signed(checkpoint: Any, keys: Sequence[str | note.Verifier], origin: Any) -> note.Checkpoint:
    if not isinstance(checkpoint, str):
        raise VerificationError("checkpoint is missing")
    try:
        return note.open_checkpoint(checkpoint, keys, origin if isinstance(origin, str) else None)
    except note.SignatureError as exc:
        raise VerificationError(f"checkpoint signature does not verify with the given key: {exc}") from None
    except note.NoteError as exc:
        raise VerificationError(f"checkpoint is not a valid signed checkpoint for this log: {exc}") from None


@dataclass(frozen=True)
class DisclosureReport:
    saga_id: str
    origin: str
    size: int
    records: int
    redacted: int
    seal_leaf: int

    def summary(self) -> str:
        extra = f", {self.redacted} redacted" if self.redacted else ""
        return (
            f"saga {self.saga_id}: {self.records} record(s){extra}, complete per its seal at leaf "
            f"{self.seal_leaf}, all included in {self.origin} at size {self.size}"
        )


def _entry(entry: Any, what: str, cp: note.Checkpoint) -> tuple[int, str, int, dict[str, Any]]:
    if not isinstance(entry, dict):
        raise VerificationError(f"{what} is not a JSON object")
    index, stream, position, record = (entry.get(k) for k in ("leaf_index", "stream", "position", "record"))
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise VerificationError(f"{what} has no valid leaf_index")
    if "record_json" in entry:
        # A record holding NaN or Infinity, which strict JSON cannot carry: `record` shows those
        # numbers as strings, `record_json` is the record exactly (bare NaN/Infinity tokens).
        try:
            record = json.loads(entry["record_json"])
        except (TypeError, ValueError, RecursionError):
            raise VerificationError(f"{what} (leaf {index}) has a record_json that is not JSON") from None
    try:
        record = check_record(record)
    except VerificationError as exc:
        raise VerificationError(f"{what} (leaf {index}): {exc}") from None
    stream, position = check_location(stream, position)
    leaf = record_leaf_hash(stream, position, record)
    proof = entry.get("inclusion")
    if not isinstance(proof, list):
        raise VerificationError(f"{what} (leaf {index}) has no inclusion proof")
    try:
        merkle.verify_inclusion(leaf, index, cp.size, [unb64(p, "proof hash") for p in proof], cp.root_hash)
    except merkle.ProofError as exc:
        raise VerificationError(
            f"{what} (leaf {index}) is not included in the checkpoint (size {cp.size}): {exc}"
        ) from None
    return index, stream, position, record


def verify_disclosure(
    bundle: Any, keys: str | note.Verifier | Iterable[str | note.Verifier]
) -> DisclosureReport:
    """Return a report when everything holds; raise VerificationError naming the first failure."""
    key_list = [keys] if isinstance(keys, str | note.Verifier) else list(keys)
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise VerificationError(f"not a {FORMAT} bundle")
    saga_id = bundle.get("saga_id")
    cp = open_signed(bundle.get("checkpoint"), key_list, bundle.get("origin"))
    records = bundle.get("records")
    if not isinstance(records, list) or not records:
        raise VerificationError("bundle has no records")

    checked: list[tuple[int, str, int, dict]] = []
    redacted = 0
    for i, entry in enumerate(records):
        index, stream, position, record = _entry(entry, f"record #{i}", cp)
        if checked and index <= checked[-1][0]:
            raise VerificationError(
                f"record #{i} (leaf {index}) is out of leaf order after leaf {checked[-1][0]} (reordered)"
            )
        if record.get(REDACTED_FIELD):
            redacted += 1
        elif record.get("saga_id") != saga_id:
            raise VerificationError(
                f"record #{i} (leaf {index}) belongs to saga {record.get('saga_id')!r}, not {saga_id!r}"
            )
        for prev_index, prev_stream, prev_pos, prev_record in reversed(checked):
            if prev_stream == stream:
                if position == prev_pos + 1 and record[PREV_FIELD] != prev_record[HASH_FIELD]:
                    raise VerificationError(
                        f"record #{i} (leaf {index}) does not link to leaf {prev_index} before it in {stream}"
                    )
                break
        checked.append((index, stream, position, record))

    seal_index, seal_stream, _, seal = _entry(bundle.get("seal"), "seal", cp)
    if seal.get(REDACTED_FIELD) or seal.get("event") != SEAL_EVENT:
        raise VerificationError("seal is not a SAGA_SEALED record")
    if seal_stream != bundle.get("server_stream"):
        raise VerificationError(f"seal is in stream {seal_stream!r}, not the server stream")
    if seal.get("saga_id") != saga_id:
        raise VerificationError(f"seal is for saga {seal.get('saga_id')!r}, not {saga_id!r}")
    if seal_index <= checked[-1][0]:
        raise VerificationError("seal precedes a disclosed record: it cannot vouch for it")
    sealed = seal.get("leaves")
    if not isinstance(sealed, list):
        raise VerificationError("seal lists no leaves")
    for item in sealed:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], int)
            and isinstance(item[1], str)
        ):
            raise VerificationError("seal lists a leaf that is not [leaf index, _h]")
    sealed_pairs = [(x[0], x[1]) for x in sealed]
    shown = {(index, record[HASH_FIELD]) for index, _, _, record in checked}
    for pair in sealed_pairs:
        if pair not in shown:
            raise VerificationError(
                f"record at leaf {pair[0]} listed in the seal is missing from the disclosure"
            )
    listed = set(sealed_pairs)
    for index, _, _, record in checked:
        if (index, record[HASH_FIELD]) not in listed:
            raise VerificationError(
                f"record at leaf {index} is not listed in the seal (not part of this saga)"
            )
    if seal.get("count") != len(sealed_pairs):
        raise VerificationError("seal count does not match the leaves it lists")
    return DisclosureReport(str(saga_id), cp.origin, cp.size, len(checked), redacted, seal_index)


def verify_disclosure_file(path: str, keys: str | Iterable[str]) -> DisclosureReport:
    try:
        with open(path, encoding="utf-8") as fh:
            bundle = json.load(fh)
    except (OSError, ValueError) as exc:
        raise VerificationError(f"cannot read {path}: {exc}") from None
    return verify_disclosure(bundle, keys)


__all__ = [
    "FORMAT",
    "RULE",
    "SEAL_EVENT",
    "DisclosureReport",
    "VerificationError",
    "check_location",
    "check_record",
    "record_leaf_hash",
    "verify_disclosure",
    "verify_disclosure_file",
]
