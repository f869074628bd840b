"""Log signing keys at rest: the Ed25519 seed is encrypted with the master key(s) and decrypted
only in memory, only to sign. MultiFernet: the first master key encrypts, all of them decrypt,
so rotating the master key is "prepend the new one"."""

from __future__ import annotations

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings
from sagaplane.note import Signer

from tenants.models import Tenant


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key) for key in settings.SAGAPLANE_MASTER_KEYS])


def encrypt_seed(seed: bytes) -> str:
    return _fernet().encrypt(seed).decode("ascii")


def decrypt_seed(token: str) -> bytes:
    return _fernet().decrypt(token.encode("ascii"))


def log_origin(tenant: Tenant) -> str:
    """The checkpoint origin and key name: one log per tenant, named after it."""
    prefix = getattr(settings, "SAGAPLANE_LOG_ORIGIN_PREFIX", "sagaplane.local")
    return f"{prefix}/{tenant.slug}"


def signer_from(name: str, encrypted_seed: str) -> Signer:
    return Signer.from_seed(name, decrypt_seed(encrypted_seed))
