"""A software WebAuthn authenticator for tests: real ES256 or Ed25519 keys (`cryptography`),
real CBOR attestation objects ("none" format) and real assertions, with every flag, counter,
origin and challenge under the test's control, so hostile cases are made exactly."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

UP, UV, AT = 0x01, 0x04, 0x40
ORIGIN = "http://localhost:8000"
RP_ID = "localhost"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class SoftAuthenticator:
    algorithm: str = "ES256"
    rp_id: str = RP_ID
    origin: str = ORIGIN
    credential_id: bytes = field(default_factory=lambda: os.urandom(32))
    sign_count: int = 0
    user_handle: bytes | None = None
    key: Any = None

    def __post_init__(self) -> None:
        if self.key is None:
            self.key = (
                ec.generate_private_key(ec.SECP256R1())
                if self.algorithm == "ES256"
                else ed25519.Ed25519PrivateKey.generate()
            )

    def cose_key(self) -> bytes:
        if self.algorithm == "ES256":
            numbers = self.key.public_key().public_numbers()
            return cbor2.dumps(
                {1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")}
            )
        raw = self.key.public_key().public_bytes_raw()
        return cbor2.dumps({1: 1, 3: -8, -1: 6, -2: raw})

    def _sign(self, data: bytes) -> bytes:
        if self.algorithm == "ES256":
            return self.key.sign(data, ec.ECDSA(hashes.SHA256()))
        return self.key.sign(data)

    def _client_data(self, kind: str, challenge: str, origin: str | None) -> bytes:
        return json.dumps(
            {"type": kind, "challenge": challenge, "origin": origin or self.origin, "crossOrigin": False}
        ).encode()

    def create(
        self, options: dict[str, Any], *, uv: bool = True, origin: str | None = None
    ) -> dict[str, Any]:
        """navigator.credentials.create() for the server's options."""
        self.user_handle = unb64url(options["user"]["id"])
        client_data = self._client_data("webauthn.create", options["challenge"], origin)
        flags = UP | AT | (UV if uv else 0)
        cred = self.credential_id
        auth_data = (
            hashlib.sha256(self.rp_id.encode()).digest()
            + bytes([flags])
            + struct.pack(">I", self.sign_count)
            + bytes(16)
            + struct.pack(">H", len(cred))
            + cred
            + self.cose_key()
        )
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {
            "id": b64url(cred),
            "rawId": b64url(cred),
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(client_data),
                "attestationObject": b64url(attestation),
                "transports": ["internal"],
            },
            "clientExtensionResults": {},
        }

    def get(
        self,
        challenge: bytes | str,
        *,
        uv: bool = True,
        counter: int | None = None,
        origin: str | None = None,
        kind: str = "webauthn.get",
        rp_id: str | None = None,
    ) -> dict[str, Any]:
        """navigator.credentials.get(): an assertion over `challenge` (bytes, or base64url as in
        the server's options). The counter goes up by one unless `counter` is given."""
        text = challenge if isinstance(challenge, str) else b64url(challenge)
        if counter is None:
            self.sign_count += 1
            counter = self.sign_count
        client_data = self._client_data(kind, text, origin)
        auth_data = (
            hashlib.sha256((rp_id or self.rp_id).encode()).digest()
            + bytes([UP | (UV if uv else 0)])
            + struct.pack(">I", counter)
        )
        signature = self._sign(auth_data + hashlib.sha256(client_data).digest())
        response = {
            "clientDataJSON": b64url(client_data),
            "authenticatorData": b64url(auth_data),
            "signature": b64url(signature),
        }
        if self.user_handle is not None:
            response["userHandle"] = b64url(self.user_handle)
        return {
            "id": b64url(self.credential_id),
            "rawId": b64url(self.credential_id),
            "type": "public-key",
            "response": response,
            "clientExtensionResults": {},
        }
