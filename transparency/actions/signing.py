"""The log's signing keys: the tenant's active key (created on first use), the signers of a note
(active first, then any key being rotated out) and the verifier keys clients pin."""

from __future__ import annotations

from sagaplane import note

from core.errors import DomainError
from core.scoping import require_tenant
from tenants.models import Tenant
from transparency import keys
from transparency.models import KeyStatus, LogSigningKey


def create_key(tenant: Tenant, status: str) -> LogSigningKey:
    signer = note.generate_signer(keys.log_origin(tenant))
    return LogSigningKey.objects.create(
        tenant=tenant,
        name=signer.name,
        key_id=signer.key_id.hex(),
        public_key=signer.public_key,
        encrypted_seed=keys.encrypt_seed(signer.seed),
        status=status,
    )


def active_key(tenant: Tenant) -> LogSigningKey:
    key = LogSigningKey.objects.filter(status=KeyStatus.ACTIVE).first()
    return key if key is not None else create_key(tenant, KeyStatus.ACTIVE)


def ensure_signing_key(tenant: Tenant) -> LogSigningKey:
    """The tenant's active log key, created on first use."""
    require_tenant(tenant)
    return active_key(tenant)


def key_signers() -> list[note.Signer]:
    # Active first, then any key being rotated out: during a rotation each note carries both
    # signatures, so clients pinned to either key keep verifying.
    rows = sorted(
        LogSigningKey.objects.exclude(status=KeyStatus.RETIRED), key=lambda k: k.status != KeyStatus.ACTIVE
    )
    return [keys.signer_from(row.name, row.encrypted_seed) for row in rows]


def verifiers(include_retired: bool = True) -> list[note.Verifier]:
    rows = LogSigningKey.objects.order_by("id")
    if not include_retired:
        rows = rows.exclude(status=KeyStatus.RETIRED)
    return [note.Verifier.from_public_key(row.name, bytes(row.public_key)) for row in rows]


def sign_statement(tenant: Tenant, text: str) -> str:
    """`text` as a C2SP signed note by the tenant's log keys (active first, then any key being
    rotated out), so it verifies offline against the same verifier keys as the checkpoints. A
    tenant has keys once the integrator signed its first checkpoint; before that, 404."""
    require_tenant(tenant)
    signers = key_signers()
    if not signers:
        raise DomainError(
            "no_signing_key", "the log has no signing key yet (none before its first checkpoint)", status=404
        )
    return note.sign_note(text, signers)


def log_origin(tenant: Tenant) -> str:
    """The tenant log's origin, which is also its keys' name."""
    return keys.log_origin(tenant)


def current_verifier_keys(include_retired: bool = False) -> list[str]:
    """Verifier key strings, active first (what `GET /api/v1/audit/key` serves)."""
    order: dict[str, int] = {KeyStatus.ACTIVE: 0, KeyStatus.RETIRING: 1, KeyStatus.RETIRED: 2}
    rows = sorted(LogSigningKey.objects.all(), key=lambda k: (order[k.status], -k.pk))
    return [
        note.Verifier.from_public_key(row.name, bytes(row.public_key)).encode()
        for row in rows
        if include_retired or row.status != KeyStatus.RETIRED
    ]
