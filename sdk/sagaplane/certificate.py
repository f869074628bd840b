"""Reconciliation certificates: a signed statement that every committed effect in a range of time is
accounted for, naming each one that is not.

A certificate is a C2SP signed note (https://c2sp.org/signed-note), signed by the tenant's log key
exactly like its checkpoints, so it verifies offline with the same verifier key
(`GET /api/v1/audit/key`, the Evidence page). Its text is three lines:

    <log origin>
    sagaplane-certificate v1
    <the statement: canonical JSON, ASCII only>

The statement holds `since`, `until` and `issued_at` (ISO 8601, UTC), `log` (the latest signed
checkpoint then: `size` and base64 `root`), `effects` (how many committed effects the range
holds), `accounted` (how many of them are accounted for, per kind: `completed`,
`compensated_confirmed`, `resolved`), `exceptions` (one object per effect that is not: `saga_id`,
`step_id`, `tool`, `reason`, ...) and `clean` (no exceptions). The control plane writes it with
`format_statement`; `verify_certificate` checks the signature first, then the text's shape, and
returns the statement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .note import NoteError, parse_verifier_key, verify_note

HEADER = "sagaplane-certificate v1"
# Bounds what a verifier reads: a certificate covers at most 20,000 steps on the server.
MAX_CERTIFICATE_BYTES = 32 * 1024 * 1024


class CertificateError(ValueError):
    """The certificate does not verify: bad or missing signature, or a malformed statement."""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def format_statement(origin: str, statement: dict[str, Any]) -> str:
    """The note text (unsigned) of a certificate for the log `origin`."""
    return f"{origin}\n{HEADER}\n{canonical(statement)}\n"


@dataclass(frozen=True)
class Certificate:
    origin: str
    statement: dict[str, Any]
    signed_by: tuple[str, ...]

    @property
    def exceptions(self) -> list[dict[str, Any]]:
        return list(self.statement.get("exceptions") or [])

    @property
    def clean(self) -> bool:
        return not self.exceptions and self.statement.get("clean") is True

    def summary(self) -> str:
        s = self.statement
        accounted = s.get("accounted") or {}
        parts = ", ".join(f"{n} {kind}" for kind, n in sorted(accounted.items()) if n)
        return (
            f"{s.get('effects', 0)} effect(s) from {s.get('since')} to {s.get('until')}: "
            f"{sum(accounted.values()) if accounted else 0} accounted for ({parts or 'none'}), "
            f"{len(self.exceptions)} exception(s); log size {(s.get('log') or {}).get('size')}, "
            f"signed by {', '.join(self.signed_by)}"
        )


def parse_statement(text: str) -> tuple[str, dict[str, Any]]:
    lines = text.split("\n")
    if len(lines) != 4 or lines[3] != "" or lines[1] != HEADER:
        raise CertificateError(f"not a certificate: expected '<origin>', '{HEADER}', one JSON line")
    try:
        statement = json.loads(lines[2])
    except ValueError as exc:
        raise CertificateError(f"the statement is not JSON: {exc}") from None
    if not isinstance(statement, dict) or canonical(statement) != lines[2]:
        raise CertificateError("the statement is not a canonical JSON object")
    if not isinstance(statement.get("exceptions"), list) or not isinstance(statement.get("effects"), int):
        raise CertificateError("the statement has no effects count or exceptions list")
    if statement.get("clean") is not (not statement["exceptions"]):
        raise CertificateError("the statement's clean flag contradicts its exceptions")
    return lines[0], statement


def verify_certificate(message: str | bytes, keys: list[str]) -> Certificate:
    """Check the certificate's signature by one of `keys` (verifier key strings), then its shape.
    The key's name must be the certificate's origin (one log, one name). Raises CertificateError."""
    if isinstance(message, bytes):
        if len(message) > MAX_CERTIFICATE_BYTES:
            raise CertificateError("the certificate is larger than any the control plane issues")
        try:
            message = message.decode("utf-8")
        except UnicodeDecodeError:
            raise CertificateError("the certificate is not UTF-8") from None
    if not keys:
        raise CertificateError("no verifier key given")
    try:
        verifiers = [parse_verifier_key(key) for key in keys]
    except NoteError as exc:
        raise CertificateError(f"verifier key: {exc}") from None
    try:
        note = verify_note(message, verifiers)
    except NoteError as exc:
        raise CertificateError(f"signature: {exc}") from None
    origin, statement = parse_statement(note.text)
    known = {(v.name, v.key_id) for v in verifiers}
    signers = tuple(dict.fromkeys(s.name for s in note.signatures if (s.name, s.key_id) in known))
    if origin not in signers:
        raise CertificateError(f"signed by {', '.join(signers)}, not by the log it names ({origin})")
    return Certificate(origin, statement, signers)
