"""Signing a webhook delivery. The receiver's check is the snippet in docs/ARCHITECTURE.md
(§8.8, "Verifying a recovery webhook"); a test extracts and runs exactly that code.

The header is `Sagaplane-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`, the MAC over
`<t>.` followed by the raw body, keyed with the webhook's secret. The timestamp is signed, so a
captured delivery cannot be replayed after the tolerance, and the body is the exact bytes sent."""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.error
import urllib.request

SIGNATURE_HEADER = "Sagaplane-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


TIMEOUT_S = 10.0


def post(
    url: str, body: bytes, *, secret: str, idempotency_key: str, agent: str, read: int = 0
) -> tuple[int, bytes]:
    """POST one signed delivery: its HTTP status and at most `read` bytes of the answer. An error
    status is an answer (its body unread); an unreachable receiver raises OSError (URLError is
    one)."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json",
            SIGNATURE_HEADER: sign(secret, body),
            IDEMPOTENCY_HEADER: idempotency_key,
            "User-Agent": agent,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 (http(s), checked when set)
            return response.status, response.read(read) if read else b""
    except urllib.error.HTTPError as exc:
        return exc.code, b""
