"""Signing and sending a webhook delivery (recovery jobs and reconciliation checks). The receiver's
check is the snippet in docs/ARCHITECTURE.md (§8.8, "Verifying a recovery webhook"); a test
extracts and runs exactly that code.

Deliveries are signed as Standard Webhooks 1.0 says, so receivers verify them with the standard's
libraries: `webhook-id` (stable for the delivery however often it is retried: a digest of its
idempotency key, so no `.` and nothing the agent chose), `webhook-timestamp` (unix seconds) and
`webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>." + the raw body>`, keyed with the
secret's bytes (`whsec_<base64>`, the standard's serialisation). The timestamp is signed, so a
captured delivery cannot be replayed after the receiver's tolerance, and the body is the exact
bytes sent. Deprecated, for one release beside them: `Sagaplane-Signature: t=<unix seconds>,
v1=<hex HMAC-SHA256 of "<t>." + the body>` keyed with the secret's text as shown.

The receiver's address is vetted by the outbound guard (`core.outbound`, shared with
the witnesses): public addresses only unless `SAGAPLANE_WEBHOOK_ALLOW_PRIVATE` is on, the
connection pinned to the vetted address, a redirect an answer (a failed attempt), never followed."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import http.client
import secrets
import time

from core.outbound import (  # noqa: F401  (the guard, as the webhooks' callers name it)
    UnsafeAddress,
    allow_private,
    check_url,
    forbidden,
    pinned_connection,
    resolve,
)

STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
SIGNATURE_HEADER = "Sagaplane-Signature"  # deprecated: sent beside the standard's for one release
IDEMPOTENCY_HEADER = "Idempotency-Key"
SECRET_PREFIX = "whsec_"
TIMEOUT_S = 10.0


def new_secret() -> str:
    """A webhook's signing secret as Standard Webhooks serialises one: `whsec_` and the base64 of
    32 random bytes (the standard asks for 24 to 64)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def standard_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret. Secrets issued before Standard Webhooks signing are
    url-safe base64 without padding: their key is the bytes they encode (the docs say how a
    receiver converts one for the standard's libraries)."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error:
        pass
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        return secret.encode()  # not base64 at all (no secret this module issued)


def message_id(idempotency_key: str) -> str:
    """The delivery's `webhook-id`: the same for every attempt (and for another delivery of the
    same effect), with no `.` and nothing the agent chose, as the standard asks."""
    return "msg_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The deprecated `Sagaplane-Signature` header's value."""
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def signed_headers(
    secret: str, body: bytes, *, idempotency_key: str, timestamp: int | None = None
) -> dict[str, str]:
    """The headers that sign one delivery attempt of `body`: Standard Webhooks' three, the
    deprecated `Sagaplane-Signature` beside them, and the `Idempotency-Key`."""
    ts = int(time.time()) if timestamp is None else timestamp
    msg_id = message_id(idempotency_key)
    mac = hmac.new(standard_key(secret), f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        STANDARD_ID_HEADER: msg_id,
        STANDARD_TIMESTAMP_HEADER: str(ts),
        STANDARD_SIGNATURE_HEADER: "v1," + base64.b64encode(mac).decode(),
        SIGNATURE_HEADER: sign(secret, body, timestamp=ts),
        IDEMPOTENCY_HEADER: idempotency_key,
    }


def post(
    url: str, body: bytes, *, secret: str, idempotency_key: str, agent: str, read: int = 0
) -> tuple[int, bytes]:
    """POST one signed delivery: its HTTP status and at most `read` bytes of the answer. Any
    status is an answer (a 3xx is not followed; only a 2xx's body is read); an unreachable or
    refused receiver raises OSError (UnsafeAddress when its address is forbidden)."""
    connection, path = pinned_connection(url, TIMEOUT_S)
    try:
        connection.request(
            "POST",
            path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                **signed_headers(secret, body, idempotency_key=idempotency_key),
                "User-Agent": agent,
            },
        )
        response = connection.getresponse()
        status = response.status
        raw = response.read(read) if read and 200 <= status < 300 else b""
        return status, raw
    except http.client.HTTPException as exc:
        raise OSError(f"the webhook's answer was not HTTP: {exc!r}") from None
    finally:
        connection.close()
