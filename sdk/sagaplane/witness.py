"""A C2SP tlog-witness (https://c2sp.org/tlog-witness): cosigns a log's checkpoints only when each
is consistent with every checkpoint of that log it cosigned before.

`Witness.add_checkpoint(body)` is the protocol's `POST /add-checkpoint`, answered as the spec
says: 400 malformed request or old size above the checkpoint's, 404 unknown origin, 403 no valid
signature by a trusted key for the origin (or a trusted key's line that fails to verify), 409
old size is not the size last cosigned (body: that size, `text/x.tlog.size`), 422 the checkpoint
is not consistent (a proof that does not verify, a different root at the same size, a proof from
size 0, an empty tree whose root is not the empty hash), 200 the cosignature lines.

State is one SQLite file in the witness's folder (`witness.db`). The check against the latest
cosigned checkpoint and its replacement are one `BEGIN IMMEDIATE` transaction, committed before
the answer: two requests (threads or processes) never both pass the check against the same
state (the roll-back race tlog-witness describes). A validly signed checkpoint that fails a
consistency check is kept in the `evidence` table: proof that the log showed two histories.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cosignature, merkle, note

__all__ = ["Answer", "Witness", "load_cosigners", "parse_log_lines", "write_new_witness"]

SIZE_CONTENT_TYPE = "text/x.tlog.size"
MAX_PROOF_LINES = 63
EMPTY_ROOT = hashlib.sha256(b"").digest()
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)\Z")
KEY_FILE = "witness.key"
DB_FILE = "witness.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS latest (
    origin TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    root BLOB NOT NULL,
    note TEXT NOT NULL,        -- the checkpoint as cosigned: the log's lines and ours
    cosigned_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    origin TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    reason TEXT NOT NULL,
    old_size INTEGER NOT NULL,
    proof TEXT NOT NULL,        -- base64 hashes, one a line, as sent
    note TEXT NOT NULL,         -- the validly signed checkpoint that was refused
    cosigned_size INTEGER,      -- what this witness had cosigned for the origin then
    cosigned_note TEXT
);
"""


class RequestError(ValueError):
    """The request body is not an add-checkpoint request (400)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    content_type: str = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Request:
    old_size: int
    proof: tuple[bytes, ...]
    note_text: str


def parse_request(raw: bytes) -> Request:
    """Split an add-checkpoint body: `old N`, proof lines, an empty line, the signed checkpoint."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("the body is not UTF-8") from None
    head, sep, checkpoint = text.partition("\n\n")
    if not sep:
        raise RequestError("no empty line before the checkpoint")
    lines = head.split("\n")
    if not lines[0].startswith("old ") or not _DECIMAL.match(lines[0][4:]):
        raise RequestError("the first line is not 'old <size>' in canonical decimal")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise RequestError(f"more than {MAX_PROOF_LINES} consistency proof lines")
    proof = []
    for line in lines[1:]:
        try:
            digest = base64.b64decode(line.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise RequestError("a consistency proof line is not base64") from None
        if len(digest) != merkle.HASH_SIZE:
            raise RequestError("a consistency proof line is not a 32-byte hash")
        proof.append(digest)
    return Request(int(lines[0][4:]), tuple(proof), checkpoint)


def parse_log_lines(lines: Iterable[str]) -> dict[str, list[note.Verifier]]:
    """`<origin> <log vkey>` lines (blank lines and `#` comments skipped) as origin -> keys.
    A vkey's name must be its origin (C2SP: the log key's name is the origin line)."""
    logs: dict[str, list[note.Verifier]] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"log line {number}: expected '<origin> <log vkey>'")
        origin, vkey = parts
        verifier = note.parse_verifier_key(vkey)
        if verifier.name != origin:
            raise ValueError(f"log line {number}: the vkey's name {verifier.name!r} is not the origin")
        logs.setdefault(origin, []).append(verifier)
    return logs


def write_new_witness(directory: str | os.PathLike[str], name: str) -> list[cosignature.Cosigner]:
    """Make the witness's keys (Ed25519 type 0x04, then ML-DSA-44 type 0x06) in `directory`,
    readable by its owner only; refuses to replace existing keys."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    keys = [cosignature.generate_cosigner(name, alg) for alg in cosignature_algorithms()]
    path = folder / KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"{key.encode()}\n" for key in keys))
    return keys


def cosignature_algorithms() -> list[int]:
    """Ed25519 always; ML-DSA-44 as well where cryptography (OpenSSL) provides it."""
    try:
        from cryptography.hazmat.primitives.asymmetric import mldsa

        mldsa.MLDSA44PrivateKey.generate()
    except Exception:  # an older cryptography or OpenSSL: Ed25519 only
        return [cosignature.ALG_COSIGNATURE_V1]
    return [cosignature.ALG_COSIGNATURE_V1, cosignature.ALG_MLDSA44]


def load_cosigners(directory: str | os.PathLike[str]) -> list[cosignature.Cosigner]:
    text = (Path(directory) / KEY_FILE).read_text()
    return [cosignature.parse_cosigner_key(line) for line in text.splitlines() if line.strip()]


class Witness:
    """One witness: its keys, the logs it trusts, and its state folder."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        logs: Mapping[str, Sequence[note.Verifier]],
        cosigners: Sequence[cosignature.Cosigner] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.logs = {origin: list(keys) for origin, keys in logs.items()}
        self.cosigners = list(cosigners) if cosigners is not None else load_cosigners(self.directory)
        if not self.cosigners:
            raise ValueError("the witness has no key")
        self.name = self.cosigners[0].name
        self._local = threading.local()
        with self._db() as db:
            db.executescript(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            # isolation_level=None: transactions are the explicit BEGIN IMMEDIATE below.
            db = sqlite3.connect(self.directory / DB_FILE, timeout=30.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a cosigned state survives a power cut
            self._local.db = db
        return db

    def vkeys(self) -> list[str]:
        return [c.verifier.encode() for c in self.cosigners]

    def add_checkpoint(self, raw: bytes) -> Answer:
        """The answer to `POST /add-checkpoint` with body `raw` (tlog-witness)."""
        try:
            request = parse_request(raw)
            signed = note.parse_note(request.note_text)
            checkpoint = note.parse_checkpoint(signed.text)
        except (RequestError, note.NoteError) as exc:
            return Answer(400, f"malformed request: {exc}\n")
        keys = self.logs.get(checkpoint.origin)
        if keys is None:
            return Answer(404, f"unknown log origin {checkpoint.origin!r}\n")
        try:
            note.verify_note(request.note_text, keys)
        except note.NoteError as exc:
            return Answer(403, f"not signed by a trusted key of the log: {exc}\n")
        if request.old_size > checkpoint.size:
            return Answer(400, f"old size {request.old_size} is above the checkpoint's {checkpoint.size}\n")
        return self._check_and_cosign(request, signed, checkpoint)

    def _check_and_cosign(self, request: Request, signed: note.Note, checkpoint: note.Checkpoint) -> Answer:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")  # the write lock first: check and update are one step
        try:
            row = db.execute(
                "SELECT size, root, note FROM latest WHERE origin = ?", (checkpoint.origin,)
            ).fetchone()
            latest = row[0] if row else 0
            if request.old_size != latest:
                db.execute("ROLLBACK")
                return Answer(409, f"{latest}\n", SIZE_CONTENT_TYPE)
            refusal = _inconsistency(request, checkpoint, bytes(row[1]) if row else None)
            if refusal:
                self._keep_evidence(db, request, checkpoint, refusal, row)
                db.execute("COMMIT")
                return Answer(422, f"{refusal}\n")
            lines = cosignature.cosign(signed.text, self.cosigners)
            cosigned = request.note_text + lines
            db.execute(
                "INSERT INTO latest (origin, size, root, note, cosigned_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (origin) DO UPDATE SET size = excluded.size, root = excluded.root, "
                "note = excluded.note, cosigned_at = excluded.cosigned_at",
                (checkpoint.origin, checkpoint.size, checkpoint.root_hash, cosigned, int(time.time())),
            )
            db.execute("COMMIT")  # persisted before the answer leaves
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return Answer(200, lines)

    def _keep_evidence(
        self, db: sqlite3.Connection, request: Request, checkpoint: note.Checkpoint, reason: str, row: Any
    ) -> None:
        db.execute(
            "INSERT INTO evidence (origin, received_at, reason, old_size, proof, note, cosigned_size, "
            "cosigned_note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                checkpoint.origin,
                int(time.time()),
                reason,
                request.old_size,
                "".join(base64.b64encode(h).decode() + "\n" for h in request.proof),
                request.note_text,
                row[0] if row else None,
                row[2] if row else None,
            ),
        )

    def latest(self, origin: str) -> str | None:
        """The latest cosigned checkpoint of `origin` (the log's and this witness's lines)."""
        row = self._db().execute("SELECT note FROM latest WHERE origin = ?", (origin,)).fetchone()
        return str(row[0]) if row else None

    def latest_by_origin_hash(self, origin_hash: str) -> str | None:
        for origin in self.logs:
            if hashlib.sha256(origin.encode()).hexdigest() == origin_hash:
                return self.latest(origin)
        return None

    def evidence(self) -> list[dict[str, Any]]:
        rows = self._db().execute(
            "SELECT id, origin, received_at, reason, old_size, proof, note, cosigned_size, cosigned_note "
            "FROM evidence ORDER BY id"
        )
        names = ("id", "origin", "received_at", "reason", "old_size", "proof", "note")
        out = []
        for row in rows:
            item = dict(zip(names, row[:7], strict=True))
            item["cosigned"] = {"size": row[7], "note": row[8]} if row[7] is not None else None
            out.append(item)
        return out

    def evidence_json(self) -> str:
        return json.dumps(self.evidence(), indent=2)


def _inconsistency(request: Request, checkpoint: note.Checkpoint, stored_root: bytes | None) -> str:
    """Why the checkpoint is not consistent with the one last cosigned ('' when it is)."""
    if checkpoint.size == 0 and checkpoint.root_hash != EMPTY_ROOT:
        return "a checkpoint of size 0 must have the empty tree's root"
    if request.old_size == 0:
        return "a consistency proof from size 0 must be empty" if request.proof else ""
    assert stored_root is not None  # old size matched a stored, non-zero size
    if request.old_size == checkpoint.size:
        if checkpoint.root_hash != stored_root:
            return f"a different root hash at size {checkpoint.size}, which this witness cosigned"
        return "sizes are equal but the consistency proof is not empty" if request.proof else ""
    try:
        merkle.verify_consistency(
            request.old_size, checkpoint.size, request.proof, stored_root, checkpoint.root_hash
        )
    except merkle.MerkleError as exc:
        return f"the consistency proof from {request.old_size} to {checkpoint.size} does not verify: {exc}"
    return ""
