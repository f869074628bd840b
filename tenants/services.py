"""Every state change of the tenants context. Each runs in one transaction as its tenant, so
its audit record (appended to the tenant's server stream) commits or rolls back with it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from audit.services import append_server_record
from tenants.models import ApiKey, InvitationUse, Membership, Role, Scope, Tenant, hash_api_key
from tenants.scoping import tenant_context

User = get_user_model()


class TenantError(ValueError):
    """A refused change, with a machine-readable code and the field at fault."""

    def __init__(self, code: str, field: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.field = field


def create_tenant(slug: str, name: str, owner_email: str, owner_password: str | None = None) -> Tenant:
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists():
            raise TenantError("tenant_exists", "slug", f"a tenant with slug '{slug}' already exists")
        tenant = Tenant.objects.create(slug=slug, name=name)
        owner = _user_for_email(owner_email, owner_password)
        with tenant_context(tenant):
            Membership.objects.create(tenant=tenant, user=owner, role=Role.OWNER)
    return tenant


def _user_for_email(email: str, password: str | None) -> Any:
    user = User.objects.filter(email__iexact=email).first()
    if user is None:
        user = User.objects.create_user(username=email.lower(), email=email.lower(), password=password)
    elif password:
        user.set_password(password)
        user.save(update_fields=["password"])
    return user


def add_member(tenant: Tenant, email: str, role: str, password: str | None = None) -> Membership:
    if role not in Role.values:
        raise TenantError("invalid_role", "role", f"role must be one of {', '.join(Role.values)}")
    with tenant_context(tenant):
        user = _user_for_email(email, password)
        membership, _ = Membership.objects.update_or_create(user=user, defaults={"role": role})
        append_server_record(
            tenant, "ADMIN_MEMBER_ADDED", {"user": user.get_username(), "role": role}, actor="system"
        )
        return membership


def create_api_key(
    tenant: Tenant,
    *,
    name: str,
    scopes: list[str],
    expires_at: datetime | None = None,
    created_by: Any = None,
    actor: str = "system",
) -> tuple[ApiKey, str]:
    """A new key and its raw value. The raw value exists only in the return value: show it once."""
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown or not scopes:
        raise TenantError(
            "invalid_scope", "scopes", f"scopes must be a non-empty subset of {', '.join(Scope.values)}"
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise TenantError("invalid_expiry", "expires_at", "expires_at must be in the future")
    prefix, raw_key = ApiKey.generate()
    creator = created_by if getattr(created_by, "pk", None) and isinstance(created_by, User) else None
    with tenant_context(tenant):
        api_key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=prefix,
            key_hash=hash_api_key(raw_key),
            scopes=sorted(set(scopes)),
            expires_at=expires_at,
            created_by=creator,
        )
        # Never the key itself: its prefix names it in the log.
        append_server_record(
            tenant,
            "ADMIN_API_KEY_CREATED",
            {"prefix": prefix, "name": name, "scopes": api_key.scopes, "expires_at": expires_at},
            actor=actor,
        )
    return api_key, raw_key


def revoke_api_key(api_key: ApiKey, *, actor: str = "system") -> ApiKey:
    with tenant_context(api_key.tenant):
        if api_key.revoked_at is None:
            api_key.revoked_at = timezone.now()
            api_key.save(update_fields=["revoked_at"])
            append_server_record(
                api_key.tenant,
                "ADMIN_API_KEY_REVOKED",
                {"prefix": api_key.prefix, "name": api_key.name},
                actor=actor,
            )
    return api_key


def accept_invitation(
    tenant: Tenant,
    email: str,
    role: str,
    password: str | None = None,
    *,
    nonce: str,
    actor: str = "system",
) -> Membership:
    """A signed invitation was accepted: the person (created with `password` when new) joins
    `tenant` with `role`. An existing member keeps the role they already have. Each invitation
    (its nonce) is accepted once."""
    if role not in Role.values:
        raise TenantError("invalid_role", "role", f"role must be one of {', '.join(Role.values)}")
    with tenant_context(tenant):
        if InvitationUse.objects.filter(nonce=nonce).exists():
            raise TenantError("invitation_used", "token", "this invitation has already been used")
        InvitationUse.objects.create(nonce=nonce, email=email.lower())
        existing = User.objects.filter(email__iexact=email).first()
        if existing is None:
            if not password:
                raise TenantError("password_required", "password", "a new account needs a password")
            user = User.objects.create_user(username=email.lower(), email=email.lower(), password=password)
        else:
            user = existing
        membership, created = Membership.objects.get_or_create(user=user, defaults={"role": role})
        if created:
            fields = {"user": user.get_username(), "role": role, "via": "invitation"}
            append_server_record(tenant, "ADMIN_MEMBER_ADDED", fields, actor=actor)
        return membership


def _other_owners(membership: Membership) -> bool:
    return Membership.objects.filter(role=Role.OWNER).exclude(pk=membership.pk).exists()


def change_member_role(membership: Membership, role: str, *, actor: str = "system") -> Membership:
    if role not in Role.values:
        raise TenantError("invalid_role", "role", f"role must be one of {', '.join(Role.values)}")
    with tenant_context(membership.tenant):
        membership = Membership.objects.select_for_update().get(pk=membership.pk)
        if membership.role == Role.OWNER and role != Role.OWNER and not _other_owners(membership):
            raise TenantError("last_owner", "role", "a tenant must keep at least one owner")
        if membership.role != role:
            previous = membership.role
            membership.role = role
            membership.save(update_fields=["role"])
            append_server_record(
                membership.tenant,
                "ADMIN_MEMBER_ROLE_CHANGED",
                {"user": membership.user.get_username(), "role": role, "previous_role": previous},
                actor=actor,
            )
        return membership


def remove_member(membership: Membership, *, actor: str = "system") -> None:
    with tenant_context(membership.tenant):
        membership = Membership.objects.select_for_update().get(pk=membership.pk)
        if membership.role == Role.OWNER and not _other_owners(membership):
            raise TenantError("last_owner", "role", "a tenant must keep at least one owner")
        append_server_record(
            membership.tenant,
            "ADMIN_MEMBER_REMOVED",
            {"user": membership.user.get_username(), "role": membership.role},
            actor=actor,
        )
        membership.delete()
