"""Organisations, their members and roles, and the API keys their agents use."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from core.scoping import TenantScopedModel


class Tenant(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    APPROVER = "approver", "Approver"
    AUDITOR = "auditor", "Auditor"
    VIEWER = "viewer", "Viewer"


# Who may do what, by role. Views name the capability, never a list of roles.
ROLE_CAPABILITIES: dict[str, frozenset[str]] = {
    # "fleet": change budgets and rate limits; "halt": engage and lift kill switches, quarantine;
    # "integrate": connect the tenant to another service (Slack).
    Role.OWNER: frozenset(
        {
            "read",
            "manage_members",
            "manage_keys",
            "audit",
            "approve",
            "fleet",
            "halt",
            "break_glass",
            "integrate",
        }
    ),
    Role.ADMIN: frozenset({"read", "manage_members", "manage_keys", "audit", "approve", "fleet", "halt"}),
    Role.APPROVER: frozenset({"read", "approve", "halt"}),
    Role.AUDITOR: frozenset({"read", "audit"}),
    Role.VIEWER: frozenset({"read"}),
}


class Membership(TenantScopedModel):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="one_membership_per_tenant")]

    def can(self, capability: str) -> bool:
        return capability in ROLE_CAPABILITIES[self.role]


class InvitationUse(TenantScopedModel):
    """The nonce of an accepted invitation: a link works once, so a member removed later cannot
    walk back in with the link that first let them in."""

    nonce = models.CharField(max_length=64)
    email = models.EmailField()
    accepted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "nonce"], name="invitation_used_once")]


class Scope(models.TextChoices):
    INGEST = "ingest", "Ship records"
    GATE = "gate", "Ask the pre-flight gate"
    READ = "read", "Read sagas and evidence"
    RECOVERY = "recovery", "Run recovery jobs"
    AUDIT = "audit", "Start and download WORM exports"
    CONTROL = "control", "Manage fleet and approval policies, halts"


API_KEY_PREFIX = "sp"
_prefix_validator = RegexValidator(r"^[a-z0-9]{12}$")


def hash_api_key(raw_key: str) -> str:
    # Keys carry 256 bits of randomness, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(raw_key.encode()).hexdigest()


class ApiKey(TenantScopedModel):
    """An agent credential. The key is shown once; only its SHA-256 and a visible prefix are kept."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, unique=True, validators=[_prefix_validator])
    key_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    @staticmethod
    def generate() -> tuple[str, str]:
        """A new (prefix, raw key) pair. The prefix is public (listed, logged); the rest is secret."""
        prefix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
        return prefix, f"{API_KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"

    @staticmethod
    def prefix_of(raw_key: str) -> str | None:
        parts = raw_key.split("_", 2)
        if len(parts) != 3 or parts[0] != API_KEY_PREFIX or len(parts[1]) != 12:
            return None
        return parts[1]

    def matches(self, raw_key: str) -> bool:
        return hmac.compare_digest(self.key_hash, hash_api_key(raw_key))

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    def __str__(self) -> str:
        return f"{self.name} ({API_KEY_PREFIX}_{self.prefix}_…)"
