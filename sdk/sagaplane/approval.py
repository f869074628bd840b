"""Offline verification of the passkey approvals in a saga disclosure (``sagaplane verify-approval``).

An approval vote signed with a passkey is kept whole in its record (``APPROVAL_VOTE`` or
``APPROVAL_BREAK_GLASS`` in the tenant's server stream, carrying the saga id, so the saga's
disclosure holds it and its seal counts it). Its ``assertion`` holds the WebAuthn material:
``client_data_json``, ``authenticator_data``, ``signature``, the credential's COSE
``public_key`` and ``credential_id`` (base64url), the relying party id, the ``challenge`` and the
server ``nonce`` (hex). The record names the ``action_digest`` (SHA-256 of the canonical action).

For each such vote the verifier checks, with nothing but the file:
- the record's own digest (``_cd``) covers what it says (and, given the log's verifier key, the
  whole disclosure verifies: signature, inclusion proofs, seal);
- challenge = SHA-256(action digest ‖ nonce), and clientData.challenge is that challenge;
- clientData.type is ``webauthn.get``;
- authenticatorData's RP id hash is SHA-256(rp id), and its flags say the user was present and
  verified (UP and UV);
- the signature over authenticatorData ‖ SHA-256(clientDataJSON) verifies with the COSE public key
  (ES256, EdDSA/Ed25519, RS256).

Standard library only, except the signature checks (the ``cryptography`` extra).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .disclosure import FORMAT, VerificationError, check_record, verify_disclosure
from .events import Event

VOTE_EVENTS = (Event.APPROVAL_VOTE, Event.APPROVAL_BREAK_GLASS)
FLAG_UP, FLAG_UV = 0x01, 0x04
MAX_CBOR_DEPTH = 4

RULE = (
    "For each APPROVAL_VOTE / APPROVAL_BREAK_GLASS record with an assertion: the record's digest holds; "
    "SHA-256(bytes(action_digest) || bytes(nonce)) equals the assertion's challenge and clientData's "
    "challenge (base64url); clientData.type is webauthn.get; authenticatorData[0:32] is SHA-256(rp_id) and "
    "its flags have UP and UV; the signature over authenticatorData || SHA-256(clientDataJSON) verifies "
    "with the COSE public key."
)


# ----------------------------------------------------------------------------------- encoding


def _b64url(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise VerificationError(f"{what} is missing or not base64url text")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise VerificationError(f"{what} is not base64url") from None


def _hex(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise VerificationError(f"{what} is missing or not hex text")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise VerificationError(f"{what} is not hex") from None


def _cbor(data: bytes, pos: int = 0, depth: int = 0) -> tuple[Any, int]:
    """A minimal CBOR reader for COSE keys: integers, byte and text strings, arrays, maps."""
    if depth > MAX_CBOR_DEPTH or pos >= len(data):
        raise VerificationError("the public key is not a COSE key (CBOR)")
    head = data[pos]
    major, info = head >> 5, head & 0x1F
    pos += 1
    if info < 24:
        arg = info
    elif info in (24, 25, 26, 27):
        size = 1 << (info - 24)
        if pos + size > len(data):
            raise VerificationError("the public key is truncated")
        arg = int.from_bytes(data[pos : pos + size], "big")
        pos += size
    else:
        raise VerificationError("the public key uses CBOR this verifier does not read")
    if major == 0:
        return arg, pos
    if major == 1:
        return -1 - arg, pos
    if major in (2, 3):
        if pos + arg > len(data):
            raise VerificationError("the public key is truncated")
        raw = data[pos : pos + arg]
        return (raw if major == 2 else raw.decode("utf-8", "replace")), pos + arg
    if major == 4:
        items = []
        for _ in range(min(arg, 64)):
            item, pos = _cbor(data, pos, depth + 1)
            items.append(item)
        return items, pos
    if major == 5:
        out: dict[Any, Any] = {}
        for _ in range(min(arg, 64)):
            key, pos = _cbor(data, pos, depth + 1)
            value, pos = _cbor(data, pos, depth + 1)
            out[key] = value
        return out, pos
    raise VerificationError("the public key uses CBOR this verifier does not read")


# ---------------------------------------------------------------------------------- signatures


def verify_cose_signature(cose_key: bytes, signature: bytes, message: bytes) -> str:
    """Verify `signature` over `message` with a COSE public key; return the algorithm's name."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
    except ImportError:  # pragma: no cover - the extra is documented
        raise VerificationError(
            "signature checks need the crypto extra: pip install 'sagaplane[crypto]'"
        ) from None
    key, _ = _cbor(cose_key)
    if not isinstance(key, dict):
        raise VerificationError("the public key is not a COSE key map")
    kty, alg = key.get(1), key.get(3)
    try:
        if kty == 2 and alg == -7 and key.get(-1) == 1:
            x, y = key.get(-2), key.get(-3)
            if not (isinstance(x, bytes) and isinstance(y, bytes) and len(x) == len(y) == 32):
                raise VerificationError("the ES256 key's coordinates are malformed")
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + x + y)
            public.verify(signature, message, ec.ECDSA(hashes.SHA256()))
            return "ES256"
        if kty == 1 and alg == -8 and key.get(-1) == 6:
            raw = key.get(-2)
            if not (isinstance(raw, bytes) and len(raw) == 32):
                raise VerificationError("the Ed25519 key is malformed")
            ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(signature, message)
            return "EdDSA"
        if kty == 3 and alg == -257:
            n, e = key.get(-1), key.get(-2)
            if not (isinstance(n, bytes) and isinstance(e, bytes)):
                raise VerificationError("the RSA key is malformed")
            numbers = rsa.RSAPublicNumbers(int.from_bytes(e, "big"), int.from_bytes(n, "big"))
            numbers.public_key().verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
            return "RS256"
    except InvalidSignature:
        raise VerificationError("the signature does not verify with the credential's public key") from None
    except ValueError as exc:
        raise VerificationError(f"the public key is not usable: {exc}") from None
    raise VerificationError(f"unsupported COSE key (kty {kty!r}, alg {alg!r})")


# ------------------------------------------------------------------------------------- one vote


@dataclass(frozen=True)
class VerifiedVote:
    leaf_index: int | None
    approval_id: str
    voter: str
    choice: str
    action_digest: str
    algorithm: str
    credential_id: str
    break_glass: bool


def verify_vote_record(record: dict[str, Any], leaf_index: int | None = None) -> VerifiedVote:
    """Check one vote record's passkey assertion (the rule above); raise VerificationError."""
    assertion = record.get("assertion")
    if not isinstance(assertion, dict):
        raise VerificationError("the vote carries no passkey assertion")
    digest = _hex(record.get("action_digest"), "action_digest")
    if len(digest) != 32:
        raise VerificationError("action_digest is not a SHA-256")
    nonce = _hex(assertion.get("nonce"), "the assertion's nonce")
    expected = hashlib.sha256(digest + nonce).digest()
    if "challenge" in assertion and _hex(assertion["challenge"], "the assertion's challenge") != expected:
        raise VerificationError("the challenge is not SHA-256(action digest || nonce): another action")
    client_data_json = _b64url(assertion.get("client_data_json"), "client_data_json")
    try:
        client_data = json.loads(client_data_json)
    except (ValueError, UnicodeDecodeError):
        raise VerificationError("clientDataJSON is not JSON") from None
    if not isinstance(client_data, dict):
        raise VerificationError("clientDataJSON is not an object")
    if client_data.get("type") != "webauthn.get":
        raise VerificationError(f"clientData.type is {client_data.get('type')!r}, not 'webauthn.get'")
    if _b64url(client_data.get("challenge"), "clientData.challenge") != expected:
        raise VerificationError("the passkey signed another challenge than this action's (digest and nonce)")
    auth_data = _b64url(assertion.get("authenticator_data"), "authenticator_data")
    if len(auth_data) < 37:
        raise VerificationError("authenticatorData is too short")
    rp_id = assertion.get("rp_id")
    if not isinstance(rp_id, str) or auth_data[:32] != hashlib.sha256(rp_id.encode()).digest():
        raise VerificationError("authenticatorData is for another relying party than rp_id")
    flags = auth_data[32]
    if not flags & FLAG_UP:
        raise VerificationError("the user was not present (UP flag clear)")
    if not flags & FLAG_UV:
        raise VerificationError("the user was not verified (UV flag clear)")
    signature = _b64url(assertion.get("signature"), "signature")
    public_key = _b64url(assertion.get("public_key"), "public_key")
    algorithm = verify_cose_signature(
        public_key, signature, auth_data + hashlib.sha256(client_data_json).digest()
    )
    return VerifiedVote(
        leaf_index=leaf_index,
        approval_id=str(record.get("approval_id", "")),
        voter=str(record.get("voter", "")),
        choice=str(record.get("choice", "")),
        action_digest=digest.hex(),
        algorithm=algorithm,
        credential_id=str(assertion.get("credential_id", "")),
        break_glass=record.get("event") == Event.APPROVAL_BREAK_GLASS,
    )


# --------------------------------------------------------------------------------- a disclosure


@dataclass(frozen=True)
class ApprovalReport:
    saga_id: str
    votes: list[VerifiedVote] = field(default_factory=list)
    other_votes: int = 0
    disclosure_verified: bool = False

    def summary(self) -> str:
        who = "; ".join(
            f"{v.voter} {v.choice}{' (break-glass)' if v.break_glass else ''} {v.approval_id} "
            f"with {v.algorithm} passkey {v.credential_id[:12]}… over action {v.action_digest[:16]}…"
            for v in self.votes
        )
        others = f", {self.other_votes} vote(s) without a passkey" if self.other_votes else ""
        scope = (
            "disclosure verified against the signed checkpoint"
            if self.disclosure_verified
            else "record digests only (pass --key to verify the disclosure too)"
        )
        return f"saga {self.saga_id}: {len(self.votes)} passkey vote(s) verified{others} [{scope}]" + (
            f": {who}" if who else ""
        )


def verify_approvals(bundle: Any, keys: Iterable[str] | None = None) -> ApprovalReport:
    """Every passkey vote in a saga disclosure, verified offline; with `keys`, the disclosure too."""
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise VerificationError(f"not a {FORMAT} bundle")
    key_list = list(keys or [])
    if key_list:
        verify_disclosure(bundle, key_list)
    records = bundle.get("records")
    if not isinstance(records, list):
        raise VerificationError("bundle has no records")
    requested: dict[str, str] = {}
    votes: list[VerifiedVote] = []
    others = 0
    for i, entry in enumerate(records):
        if not isinstance(entry, dict):
            raise VerificationError(f"record #{i} is not a JSON object")
        record = entry.get("record")
        if not isinstance(record, dict) or record.get("_redacted"):
            continue
        event = record.get("event")
        if event not in VOTE_EVENTS and event != Event.APPROVAL_REQUESTED:
            continue
        index = entry.get("leaf_index")
        try:
            record = check_record(record)
        except VerificationError as exc:
            raise VerificationError(f"record #{i} (leaf {index}): {exc}") from None
        if event == Event.APPROVAL_REQUESTED:
            requested[str(record.get("approval_id"))] = str(record.get("action_digest"))
            continue
        if not isinstance(record.get("assertion"), dict):
            others += 1
            continue
        try:
            vote = verify_vote_record(record, index if isinstance(index, int) else None)
        except VerificationError as exc:
            raise VerificationError(f"vote at record #{i} (leaf {index}): {exc}") from None
        asked = requested.get(vote.approval_id)
        if asked is not None and asked != vote.action_digest:
            raise VerificationError(
                f"vote at record #{i} (leaf {index}) signs action {vote.action_digest[:16]}…, but request "
                f"{vote.approval_id} asked for {asked[:16]}…"
            )
        votes.append(vote)
    return ApprovalReport(str(bundle.get("saga_id")), votes, others, bool(key_list))


def verify_approval_file(path: str, keys: Iterable[str] | None = None) -> ApprovalReport:
    try:
        with open(path, encoding="utf-8") as fh:
            bundle = json.load(fh)
    except (OSError, ValueError) as exc:
        raise VerificationError(f"cannot read {path}: {exc}") from None
    return verify_approvals(bundle, keys)


__all__ = [
    "RULE",
    "ApprovalReport",
    "VerifiedVote",
    "verify_approval_file",
    "verify_approvals",
    "verify_cose_signature",
    "verify_vote_record",
]
