"""C2SP signed notes and tlog checkpoints with Ed25519 keys.

Formats (https://c2sp.org/signed-note, https://c2sp.org/tlog-checkpoint), compatible
with Go's golang.org/x/mod/sumdb/note:

* note: ``text`` (UTF-8, ends in a newline, no control characters but newline),
  a blank line, then one or more lines ``— <name> <base64(key id || signature)>``
  (U+2014 EM DASH, a space, the key name, a space, the signature).
* key id: ``SHA-256(name || 0x0A || 0x01 || public key)[:4]``.
* verifier key: ``<name>+<hex key id>+<base64(0x01 || public key)>``.
* signer key: ``PRIVATE+KEY+<name>+<hex key id>+<base64(0x01 || seed)>``.
* checkpoint body: ``<origin>\\n<size>\\n<base64 root>\\n`` plus optional extension lines.

Everything except the actual Ed25519 operations is pure standard library;
``cryptography`` is imported only when a key is generated, used to sign, or
used to verify, so parsing works without it.

Errors are :class:`NoteError` subclasses (all ``ValueError``): a malformed input is
never confused with a bad signature, and a bad signature is never returned as a
falsy value that a caller might forget to check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType

__all__ = [
    "ALG_ED25519",
    "Checkpoint",
    "MalformedCheckpointError",
    "MalformedKeyError",
    "MalformedNoteError",
    "Note",
    "NoteError",
    "NoteSignature",
    "SignatureError",
    "Signer",
    "Verifier",
    "format_checkpoint",
    "generate_key",
    "generate_signer",
    "key_id",
    "open_checkpoint",
    "parse_checkpoint",
    "parse_note",
    "parse_signer_key",
    "parse_verifier_key",
    "sign_checkpoint",
    "sign_note",
    "verify_note",
]

ALG_ED25519 = 0x01
_SIG_PREFIX = "\u2014 "  # EM DASH + space starts every signature line.
# Bounds the work an attacker can make a verifier do with one note (same limit as Go).
MAX_SIGNATURES = 100
_HASH_SIZE = 32
_MAX_SIZE = (1 << 64) - 1
_HEX8 = re.compile(r"[0-9a-fA-F]{8}\Z")
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)\Z")


# --------------------------------------------------------------------------- errors


class NoteError(ValueError):
    """Base class of every error raised by this module."""


class MalformedKeyError(NoteError):
    """A signer or verifier key string (or key name) is not well formed."""


class MalformedNoteError(NoteError):
    """A note's text or signature block does not follow the signed-note format."""


class SignatureError(NoteError):
    """The note carries no valid signature by the expected key, or a bad one by it."""


class MalformedCheckpointError(NoteError):
    """A checkpoint body does not follow tlog-checkpoint."""


# --------------------------------------------------------------------------- helpers


def _ed25519() -> ModuleType:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Ed25519 keys need the 'cryptography' package: pip install cryptography") from exc
    return ed25519


def _b64decode_strict(value: str, error: type[NoteError], what: str) -> bytes:
    # Canonical encoding only: padding required and the round trip must be exact, so
    # one signature or root has exactly one spelling.
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise error(f"{what} is not valid base64")
    if base64.b64encode(raw).decode("ascii") != value:
        raise error(f"{what} is not canonical base64")
    return raw


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise MalformedKeyError("key name must be a non-empty string")
    if "+" in name or any(ch.isspace() for ch in name):
        raise MalformedKeyError(f"key name {name!r} must not contain '+' or spaces")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise MalformedKeyError(f"key name {name!r} contains control characters")


def _check_text(text: str) -> None:
    if not isinstance(text, str):
        raise MalformedNoteError("note text must be str")
    if not text.endswith("\n"):
        raise MalformedNoteError("note text must end with a newline")
    for ch in text:
        if ch != "\n" and unicodedata.category(ch) == "Cc":
            raise MalformedNoteError(f"note text contains control character U+{ord(ch):04X}")
        # Lone surrogates cannot be encoded as UTF-8, so the bytes that were signed
        # would be ambiguous.
        if unicodedata.category(ch) == "Cs":
            raise MalformedNoteError("note text is not valid UTF-8")


def key_id(name: str, public_key: bytes, algorithm: int = ALG_ED25519) -> bytes:
    """Four-byte key id: SHA-256(name || 0x0A || algorithm || public key)[:4]."""
    _check_name(name)
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([algorithm]) + bytes(public_key)).digest()[:4]


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class Verifier:
    """An Ed25519 verifier key: ``name``, 4-byte ``key_id`` and 32-byte ``public_key``."""

    name: str
    key_id: bytes
    public_key: bytes

    def __post_init__(self) -> None:
        _check_name(self.name)
        if len(self.public_key) != 32:
            raise MalformedKeyError("Ed25519 public key must be 32 bytes")
        if self.key_id != key_id(self.name, self.public_key):
            raise MalformedKeyError(f"key id does not match name {self.name!r} and public key")

    @classmethod
    def from_public_key(cls, name: str, public_key: bytes) -> Verifier:
        return cls(name, key_id(name, public_key), bytes(public_key))

    def encode(self) -> str:
        """``name+hex(key id)+base64(0x01 || public key)``."""
        data = base64.b64encode(bytes([ALG_ED25519]) + self.public_key).decode("ascii")
        return f"{self.name}+{self.key_id.hex()}+{data}"

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Raw Ed25519 check of ``signature`` (64 bytes, no key id) over ``message``."""
        if len(signature) != 64:
            return False
        ed25519 = _ed25519()
        from cryptography.exceptions import InvalidSignature

        try:
            ed25519.Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True

    def __str__(self) -> str:
        return self.encode()


@dataclass(frozen=True)
class Signer:
    """An Ed25519 signer key. ``repr`` never shows the seed; ``encode()`` does."""

    name: str
    key_id: bytes
    seed: bytes = field(repr=False)
    public_key: bytes

    def __post_init__(self) -> None:
        _check_name(self.name)
        if len(self.seed) != 32 or len(self.public_key) != 32:
            raise MalformedKeyError("Ed25519 seed and public key must be 32 bytes")
        if self.key_id != key_id(self.name, self.public_key):
            raise MalformedKeyError(f"key id does not match name {self.name!r} and key")

    @classmethod
    def from_seed(cls, name: str, seed: bytes) -> Signer:
        if len(seed) != 32:
            raise MalformedKeyError("Ed25519 seed must be 32 bytes")
        pub = _ed25519().Ed25519PrivateKey.from_private_bytes(bytes(seed)).public_key().public_bytes_raw()
        return cls(name, key_id(name, pub), bytes(seed), pub)

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, self.key_id, self.public_key)

    @property
    def verifier_key(self) -> str:
        return self.verifier.encode()

    def encode(self) -> str:
        """``PRIVATE+KEY+name+hex(key id)+base64(0x01 || seed)``: a secret, store it encrypted."""
        data = base64.b64encode(bytes([ALG_ED25519]) + self.seed).decode("ascii")
        return f"PRIVATE+KEY+{self.name}+{self.key_id.hex()}+{data}"

    def sign(self, message: bytes) -> bytes:
        """Raw 64-byte Ed25519 signature over ``message``."""
        key = _ed25519().Ed25519PrivateKey.from_private_bytes(self.seed)
        signature: bytes = key.sign(bytes(message))
        return signature


def generate_signer(name: str) -> Signer:
    """A fresh random Ed25519 signer named ``name``."""
    _check_name(name)
    seed = _ed25519().Ed25519PrivateKey.generate().private_bytes_raw()
    return Signer.from_seed(name, seed)


def generate_key(name: str) -> tuple[str, str]:
    """``(signer key string, verifier key string)``, like Go's ``note.GenerateKey``."""
    signer = generate_signer(name)
    return signer.encode(), signer.verifier_key


def _split_key(value: str, parts: int, what: str) -> list[str]:
    if not isinstance(value, str):
        raise MalformedKeyError(f"{what} must be a string")
    # Only the leading fields are split: the trailing base64 key data may contain '+'.
    fields = value.split("+", parts - 1)
    if len(fields) != parts:
        raise MalformedKeyError(f"{what} must have {parts} '+'-separated fields")
    return fields


def _decode_key_fields(name: str, hex_id: str, data: str, what: str) -> tuple[bytes, bytes]:
    _check_name(name)
    if not _HEX8.match(hex_id):
        raise MalformedKeyError(f"{what} key id must be 8 hex digits")
    raw = _b64decode_strict(data, MalformedKeyError, f"{what} key data")
    if len(raw) != 33 or raw[0] != ALG_ED25519:
        raise MalformedKeyError(f"{what} key data must be 0x01 followed by 32 bytes (Ed25519)")
    return bytes.fromhex(hex_id), raw[1:]


def parse_verifier_key(vkey: str) -> Verifier:
    """Parse ``name+hex+base64(0x01||pubkey)``; the key id must match name and key."""
    name, hex_id, data = _split_key(vkey, 3, "verifier key")
    kid, pub = _decode_key_fields(name, hex_id, data, "verifier")
    if kid != key_id(name, pub):
        raise MalformedKeyError("verifier key id does not match its name and public key")
    return Verifier(name, kid, pub)


def parse_signer_key(skey: str) -> Signer:
    """Parse ``PRIVATE+KEY+name+hex+base64(0x01||seed)``; the key id must match."""
    fields = _split_key(skey, 5, "signer key")
    if fields[0] != "PRIVATE" or fields[1] != "KEY":
        raise MalformedKeyError("signer key must start with PRIVATE+KEY+")
    kid, seed = _decode_key_fields(fields[2], fields[3], fields[4], "signer")
    signer = Signer.from_seed(fields[2], seed)
    if signer.key_id != kid:
        raise MalformedKeyError("signer key id does not match its name and key")
    return signer


def _as_signer(value: Signer | str) -> Signer:
    return value if isinstance(value, Signer) else parse_signer_key(value)


def _as_verifier(value: Verifier | str) -> Verifier:
    return value if isinstance(value, Verifier) else parse_verifier_key(value)


# --------------------------------------------------------------------------- notes


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: key ``name``, 4-byte ``key_id`` and the raw ``signature``."""

    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        data = base64.b64encode(self.key_id + self.signature).decode("ascii")
        return f"{_SIG_PREFIX}{self.name} {data}\n"


@dataclass(frozen=True)
class Note:
    """A parsed note. ``text`` is only trustworthy if it came from :func:`verify_note`."""

    text: str
    signatures: tuple[NoteSignature, ...]


def sign_note(text: str, signers: Signer | str | Sequence[Signer | str]) -> str:
    """Sign ``text`` with one or more signers (several during a key rotation).

    Signature lines appear in the order given. Signers must be distinct keys.
    """
    _check_text(text)
    items: Sequence[Signer | str] = [signers] if isinstance(signers, Signer | str) else signers
    if not items:
        raise MalformedKeyError("at least one signer is required")
    message = text.encode("utf-8")
    lines: list[str] = []
    seen: set[tuple[str, bytes]] = set()
    for item in items:
        signer = _as_signer(item)
        ident = (signer.name, signer.key_id)
        if ident in seen:
            raise MalformedKeyError(f"duplicate signer {signer.name}+{signer.key_id.hex()}")
        seen.add(ident)
        lines.append(NoteSignature(signer.name, signer.key_id, signer.sign(message)).line())
    return text + "\n" + "".join(lines)


def parse_note(message: str | bytes) -> Note:
    """Split a signed note into text and signatures without verifying anything."""
    if isinstance(message, bytes | bytearray):
        try:
            message = bytes(message).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedNoteError("note is not valid UTF-8")
    if not isinstance(message, str):
        raise MalformedNoteError("note must be str or bytes")
    # The signature block starts after the last blank line; text may itself contain
    # blank lines (Go's note package behaves the same way).
    split = message.rfind("\n\n")
    if split < 0:
        raise MalformedNoteError("note has no blank line before its signatures")
    text, block = message[: split + 1], message[split + 2 :]
    _check_text(text)
    if not block:
        raise MalformedNoteError("note has no signature lines")
    if not block.endswith("\n"):
        raise MalformedNoteError("signature block must end with a newline")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise MalformedNoteError(f"more than {MAX_SIGNATURES} signatures")
    signatures: list[NoteSignature] = []
    for line in lines:
        if not line.startswith(_SIG_PREFIX):
            raise MalformedNoteError(f"signature line does not start with an em dash and space: {line!r}")
        name, sep, data = line[len(_SIG_PREFIX) :].partition(" ")
        if not sep or " " in data:
            raise MalformedNoteError(f"signature line must be '— name signature': {line!r}")
        try:
            _check_name(name)
        except MalformedKeyError as exc:
            raise MalformedNoteError(str(exc))
        raw = _b64decode_strict(data, MalformedNoteError, "signature")
        if len(raw) < 5:
            raise MalformedNoteError("signature is shorter than a key id plus one byte")
        signatures.append(NoteSignature(name, raw[:4], raw[4:]))
    return Note(text, tuple(signatures))


def verify_note(message: str | bytes, verifiers: Verifier | str | Iterable[Verifier | str]) -> Note:
    """Parse ``message`` and require a valid signature by one of ``verifiers``.

    Pass one verifier, or several to accept any of them (e.g. old and new key during
    a rotation). Signatures by other keys are ignored. A signature line that names
    a given key (same name and key id) but does not verify is an error even if
    another one does: a forged line next to a good one means something is wrong.
    Returns the parsed note; its ``text`` is then authenticated.
    """
    if isinstance(verifiers, Verifier | str):
        verifiers = [verifiers]
    known = {(v.name, v.key_id): v for v in map(_as_verifier, verifiers)}
    if not known:
        raise MalformedKeyError("at least one verifier is required")
    note = parse_note(message)
    body = note.text.encode("utf-8")
    verified = False
    for sig in note.signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            continue
        if not verifier.verify(body, sig.signature):
            raise SignatureError(f"invalid signature by {sig.name}+{sig.key_id.hex()}")
        verified = True
    if not verified:
        names = ", ".join(f"{n}+{k.hex()}" for n, k in known)
        raise SignatureError(f"note is not signed by {names}")
    return note


# --------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """A tlog checkpoint body: ``origin``, tree ``size``, ``root_hash`` and extension lines."""

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        return format_checkpoint(self.origin, self.size, self.root_hash, self.extensions)


def format_checkpoint(origin: str, size: int, root_hash: bytes, extensions: Sequence[str] = ()) -> str:
    """``origin\\nsize\\nbase64(root)\\n`` followed by any extension lines."""
    if not isinstance(origin, str) or not origin or "\n" in origin:
        raise MalformedCheckpointError("origin must be a non-empty single line")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= _MAX_SIZE:
        raise MalformedCheckpointError("size must be an int in [0, 2**64)")
    if len(root_hash) != _HASH_SIZE:
        raise MalformedCheckpointError("root hash must be 32 bytes")
    for ext in extensions:
        if not ext or "\n" in ext:
            raise MalformedCheckpointError("extension lines must be non-empty single lines")
    root = base64.b64encode(bytes(root_hash)).decode("ascii")
    text = "".join(f"{line}\n" for line in (origin, str(size), root, *extensions))
    try:
        _check_text(text)
    except MalformedNoteError as exc:
        raise MalformedCheckpointError(str(exc))
    return text


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse a checkpoint body strictly (this does not check any signature)."""
    if not isinstance(text, str):
        raise MalformedCheckpointError("checkpoint must be str")
    if not text.endswith("\n"):
        raise MalformedCheckpointError("checkpoint must end with a newline")
    try:
        _check_text(text)
    except MalformedNoteError as exc:
        raise MalformedCheckpointError(str(exc))
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise MalformedCheckpointError("checkpoint needs origin, size and root hash lines")
    origin, size_line, root_line, *extensions = lines
    if not origin:
        raise MalformedCheckpointError("empty origin line")
    # A regex rather than int(): int() also takes '+5', ' 5', '5_0' and non-ASCII digits.
    if not _DECIMAL.match(size_line):
        raise MalformedCheckpointError(f"tree size is not a canonical decimal: {size_line!r}")
    size = int(size_line)
    if size > _MAX_SIZE:
        raise MalformedCheckpointError("tree size does not fit in 64 bits")
    root = _b64decode_strict(root_line, MalformedCheckpointError, "root hash")
    if len(root) != _HASH_SIZE:
        raise MalformedCheckpointError(f"root hash is {len(root)} bytes, expected {_HASH_SIZE}")
    if any(not ext for ext in extensions):
        raise MalformedCheckpointError("empty extension line")
    return Checkpoint(origin, size, root, tuple(extensions))


def sign_checkpoint(checkpoint: Checkpoint, signers: Signer | str | Sequence[Signer | str]) -> str:
    """Signed note for ``checkpoint``.

    Callers must only sign a size/root consistent with every checkpoint signed before.
    """
    return sign_note(checkpoint.body(), signers)


def open_checkpoint(
    message: str | bytes,
    verifiers: Verifier | str | Iterable[Verifier | str],
    origin: str | None = None,
) -> Checkpoint:
    """Verify a signed checkpoint and parse its body; optionally require its origin."""
    note = verify_note(message, verifiers)
    checkpoint = parse_checkpoint(note.text)
    if origin is not None and checkpoint.origin != origin:
        raise MalformedCheckpointError(f"checkpoint origin {checkpoint.origin!r} is not {origin!r}")
    return checkpoint
