"""A person's passkeys (WebAuthn credentials).

A passkey belongs to a person (a Django user), not to a tenant: one sign-in serves every tenant
the person belongs to, and an authenticator holds one credential per account on this relying
party, so a per-tenant copy could not exist. The table therefore has no tenant column and no
row-level security policy, like the user table itself; every query names its user, and the
services check ownership. Changes are recorded in the server stream of each tenant the person is
a member of (passkeys.services)."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

HANDLE_BYTES = 32


def new_handle() -> bytes:
    return secrets.token_bytes(HANDLE_BYTES)


class PasskeyAccount(models.Model):
    """The person's WebAuthn user handle: random bytes (never the e-mail or the id), the same
    for every passkey of theirs, returned by the authenticator at sign-in."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    handle = models.BinaryField(max_length=64, default=new_handle, unique=True)

    def __str__(self) -> str:
        return f"passkey account of user {self.user_id}"


class Passkey(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="passkeys")
    name = models.CharField(max_length=100)
    # base64url without padding, as WebAuthn's JSON carries it (at most 1023 bytes: 1364 chars).
    credential_id = models.CharField(max_length=1400, unique=True)
    public_key = models.BinaryField(max_length=2048)  # the COSE_Key from the attestation
    algorithm = models.IntegerField()  # its COSE algorithm (-7 ES256, -8 EdDSA, -257 RS256)
    sign_count = models.PositiveBigIntegerField(default=0)
    aaguid = models.CharField(max_length=36, blank=True, default="")
    transports = models.JSONField(default=list)
    backed_up = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "revoked_at"], name="passkey_user_live")]

    def __str__(self) -> str:
        return f"{self.name} ({self.credential_id[:12]}…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
