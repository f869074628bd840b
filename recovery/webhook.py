"""Signing a webhook delivery. The receiver's check is the snippet in docs/ARCHITECTURE.md
(§8.8, "Verifying a recovery webhook"); a test extracts and runs exactly that code.

The header is `Sagaplane-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`, the MAC over
`<t>.` followed by the raw body, keyed with the webhook's secret. The timestamp is signed, so a
captured delivery cannot be replayed after the tolerance, and the body is the exact bytes sent."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Sagaplane-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"
