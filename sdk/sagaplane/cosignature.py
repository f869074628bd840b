"""C2SP tlog-cosignature v1: witness cosignatures on checkpoints (https://c2sp.org/tlog-cosignature).

Two cosignature types, both signed-note signature lines ``— <name> base64(key id || sig)``:

* **Ed25519** (signature type 0x04): key id ``SHA-256(name || 0x0A || 0x04 || 32-byte key)[:4]``;
  the signature is ``u64 timestamp || Ed25519(msg)`` with msg =
  ``"cosignature/v1\\ntime <t>\\n" || <checkpoint body>``.
* **ML-DSA-44** (signature type 0x06): key id over the 1312-byte public key; the signature is
  ``u64 timestamp || ML-DSA-44(cosigned_message)`` where cosigned_message is the TLS struct
  ``"subtree/v1\\n\\0" || <1-byte len> name || u64 timestamp || <1-byte len> origin ||
  u64 start(0) || u64 end(size) || root hash``.

Verifier keys (vkeys) are ``<name>+<hex key id>+base64(type || public key)``; a witness's
private key file line is ``PRIVATE+KEY+<name>+<hex key id>+base64(type || 32-byte seed)``.
Everything is the standard library except the signature operations, which use ``cryptography``
(the SDK's ``crypto`` extra; ML-DSA-44 needs cryptography 47 or later, on OpenSSL 3.5).
"""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import note

__all__ = [
    "ALG_COSIGNATURE_V1",
    "ALG_MLDSA44",
    "CosignatureVerifier",
    "Cosigner",
    "cosign",
    "generate_cosigner",
    "parse_cosigner_key",
    "parse_cosigner_vkey",
    "valid_cosignatures",
]

ALG_COSIGNATURE_V1 = 0x04  # timestamped Ed25519 checkpoint cosignature
ALG_MLDSA44 = 0x06  # timestamped ML-DSA-44 (sub)tree cosignature
_PUBLIC_SIZES = {ALG_COSIGNATURE_V1: 32, ALG_MLDSA44: 1312}
_SIGNATURE_SIZES = {ALG_COSIGNATURE_V1: 64, ALG_MLDSA44: 2420}
_MAX_TIMESTAMP = (1 << 63) - 1
_MLDSA_LABEL = b"subtree/v1\n\x00"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def signed_message(alg: int, name: str, checkpoint_text: str, timestamp: int) -> bytes:
    """The bytes a cosigner of type `alg` signs for `checkpoint_text` at `timestamp`."""
    if alg == ALG_COSIGNATURE_V1:
        return f"cosignature/v1\ntime {timestamp}\n".encode() + checkpoint_text.encode("utf-8")
    checkpoint = note.parse_checkpoint(checkpoint_text)
    origin, cosigner = checkpoint.origin.encode("utf-8"), name.encode("utf-8")
    if not 1 <= len(origin) <= 255 or not 1 <= len(cosigner) <= 255:
        raise note.MalformedCheckpointError("ML-DSA-44 cosignatures need an origin and name of 1-255 bytes")
    return (
        _MLDSA_LABEL
        + bytes([len(cosigner)])
        + cosigner
        + struct.pack(">Q", timestamp)
        + bytes([len(origin)])
        + origin
        + struct.pack(">QQ", 0, checkpoint.size)
        + checkpoint.root_hash
    )


@dataclass(frozen=True)
class CosignatureVerifier:
    """A witness's public key of cosignature type `alg` (0x04 Ed25519, 0x06 ML-DSA-44)."""

    name: str
    key_id: bytes
    alg: int
    public_key: bytes

    def __post_init__(self) -> None:
        if self.alg not in _PUBLIC_SIZES:
            raise note.MalformedKeyError(f"signature type 0x{self.alg:02x} is not a cosignature type")
        if len(self.public_key) != _PUBLIC_SIZES[self.alg]:
            raise note.MalformedKeyError(f"a type 0x{self.alg:02x} key is {_PUBLIC_SIZES[self.alg]} bytes")
        if self.key_id != note.key_id(self.name, self.public_key, self.alg):
            raise note.MalformedKeyError("cosigner key id does not match its name and public key")

    def encode(self) -> str:
        return f"{self.name}+{self.key_id.hex()}+{_b64(bytes([self.alg]) + self.public_key)}"

    def __str__(self) -> str:
        return self.encode()

    def verify(self, checkpoint_text: str, signature: bytes) -> int:
        """The timestamp of a valid cosignature (8-byte timestamp then the signature) over
        `checkpoint_text`; raises note.SignatureError when it does not verify."""
        if len(signature) != 8 + _SIGNATURE_SIZES[self.alg]:
            raise note.SignatureError(f"cosignature by {self.name} has the wrong length")
        (timestamp,) = struct.unpack(">Q", signature[:8])
        if timestamp > _MAX_TIMESTAMP:
            raise note.SignatureError(f"cosignature by {self.name} has a timestamp beyond 2^63-1")
        message = signed_message(self.alg, self.name, checkpoint_text, timestamp)
        from cryptography.exceptions import InvalidSignature

        try:
            if self.alg == ALG_COSIGNATURE_V1:
                from cryptography.hazmat.primitives.asymmetric import ed25519

                ed25519.Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature[8:], message)
            else:
                from cryptography.hazmat.primitives.asymmetric import mldsa

                mldsa.MLDSA44PublicKey.from_public_bytes(self.public_key).verify(signature[8:], message)
        except (InvalidSignature, ValueError):
            raise note.SignatureError(f"invalid cosignature by {self.name}+{self.key_id.hex()}") from None
        return timestamp


def parse_cosigner_vkey(vkey: str) -> CosignatureVerifier:
    """Parse a cosigner vkey (type 0x04 or 0x06); the key id must match name and key."""
    if not isinstance(vkey, str) or vkey.count("+") < 2:
        raise note.MalformedKeyError("a cosigner vkey is name+keyid+base64(type||key)")
    name, hex_id, data = vkey.split("+", 2)
    note.key_id(name, b"")  # checks the name
    try:
        key_id = bytes.fromhex(hex_id)
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise note.MalformedKeyError("cosigner vkey: key id is not hex or key is not base64") from None
    if len(key_id) != 4 or not raw or _b64(raw) != data:
        raise note.MalformedKeyError("cosigner vkey: key id is not 4 bytes or key is not canonical base64")
    return CosignatureVerifier(name, key_id, raw[0], raw[1:])


@dataclass(frozen=True)
class Cosigner:
    """A witness's private key (a 32-byte seed) of cosignature type `alg`."""

    name: str
    alg: int
    seed: bytes = field(repr=False)

    def _private(self) -> Any:
        if self.alg == ALG_COSIGNATURE_V1:
            from cryptography.hazmat.primitives.asymmetric import ed25519

            return ed25519.Ed25519PrivateKey.from_private_bytes(self.seed)
        from cryptography.hazmat.primitives.asymmetric import mldsa

        return mldsa.MLDSA44PrivateKey.from_seed_bytes(self.seed)

    @property
    def verifier(self) -> CosignatureVerifier:
        public = self._private().public_key().public_bytes_raw()
        return CosignatureVerifier(self.name, note.key_id(self.name, public, self.alg), self.alg, public)

    def encode(self) -> str:
        """``PRIVATE+KEY+name+hex(key id)+base64(type || seed)``: a secret."""
        return f"PRIVATE+KEY+{self.name}+{self.verifier.key_id.hex()}+{_b64(bytes([self.alg]) + self.seed)}"

    def sign(self, checkpoint_text: str, timestamp: int) -> note.NoteSignature:
        """The cosignature line's parts for `checkpoint_text` (a checkpoint body) at `timestamp`."""
        if not 0 < timestamp <= _MAX_TIMESTAMP:
            raise ValueError("a checkpoint cosignature's timestamp is never 0")
        message = signed_message(self.alg, self.name, checkpoint_text, timestamp)
        signature = struct.pack(">Q", timestamp) + self._private().sign(message)
        return note.NoteSignature(self.name, self.verifier.key_id, signature)


def generate_cosigner(name: str, alg: int = ALG_COSIGNATURE_V1) -> Cosigner:
    import os

    note.key_id(name, b"")  # checks the name
    if alg not in _PUBLIC_SIZES:
        raise note.MalformedKeyError(f"signature type 0x{alg:02x} is not a cosignature type")
    return Cosigner(name, alg, os.urandom(32))


def parse_cosigner_key(skey: str) -> Cosigner:
    fields = skey.strip().split("+", 4)
    if len(fields) != 5 or fields[:2] != ["PRIVATE", "KEY"]:
        raise note.MalformedKeyError("a cosigner key is PRIVATE+KEY+name+keyid+base64(type||seed)")
    try:
        raw = base64.b64decode(fields[4].encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise note.MalformedKeyError("cosigner key data is not base64") from None
    if len(raw) != 33:
        raise note.MalformedKeyError("cosigner key data is a type byte and a 32-byte seed")
    cosigner = Cosigner(fields[2], raw[0], raw[1:])
    if cosigner.verifier.key_id.hex() != fields[3]:
        raise note.MalformedKeyError("cosigner key id does not match its name and key")
    return cosigner


def cosign(checkpoint_text: str, cosigners: Iterable[Cosigner], timestamp: int | None = None) -> str:
    """Signature lines (each ending in a newline) of every cosigner over the checkpoint body."""
    when = int(time.time()) if timestamp is None else timestamp
    return "".join(c.sign(checkpoint_text, max(when, 1)).line() for c in cosigners)


def valid_cosignatures(
    checkpoint_text: str, signatures: Iterable[note.NoteSignature], verifiers: Iterable[CosignatureVerifier]
) -> dict[CosignatureVerifier, int]:
    """The known cosigners whose cosignature on the checkpoint verifies, with its timestamp.
    Lines by unknown keys are ignored; a line naming a known key (name and key id) that does not
    verify raises note.SignatureError, as signed-note says."""
    known = {(v.name, v.key_id): v for v in verifiers}
    found: dict[CosignatureVerifier, int] = {}
    for sig in signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is not None:
            found[verifier] = verifier.verify(checkpoint_text, sig.signature)
    return found
