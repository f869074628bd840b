"""Signing a webhook delivery, and the receiver's check (docs/ARCHITECTURE.md §8.4 shows
`verify_signature` as the snippet to copy; a test runs exactly that code).

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


# --8<-- [start:verify]
def verify_signature(secret: str, body: bytes, header: str, tolerance: int = 300) -> bool:
    """True when `header` (Sagaplane-Signature) signs `body` with `secret`, made within `tolerance` s."""
    import hashlib
    import hmac
    import time

    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    timestamp, given = fields.get("t", ""), fields.get("v1", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > tolerance:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, given)


# --8<-- [end:verify]
