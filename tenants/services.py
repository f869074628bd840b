"""Every state change of the tenants context but founding a tenant (`tenants.founding`). Each
asserts its tenant's scope (`core.scoping.require_tenant`: the transport entered it, the view mixin,
a member page, `tenants.entry.command_tenant`, the invitation page) and runs in a transaction of its
own (a savepoint inside the transport's), so its audit record (appended to the tenant's server
stream) commits or rolls back with it, even where the caller answers a refusal and goes on."""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from sagaplane.events import Event

from core import epoch, live
from core.actionaudit import append_server_record
from core.actors import Actor
from core.errors import DomainError
from core.postcommit import after_commit
from core.scoping import require_tenant
from tenants.inputs import ApiKeyCreate as ApiKeyCreate
from tenants.inputs import NewApiKey as NewApiKey
from tenants.models import ApiKey, InvitationUse, Membership, Role, Tenant, hash_api_key

User = get_user_model()


def _user_for_email(email: str, password: str | None) -> tuple[Any, bool]:
    """(the account with this e-mail, whether it was created now). An existing account is returned
    untouched: whoever acts on a tenant may not reset another person's password."""
    user = User.objects.filter(email__iexact=email).first()
    if user is not None:
        return user, False
    # No password: an unusable one (the person sets one through password reset or an invitation).
    return User.objects.create_user(username=email.lower(), email=email.lower(), password=password), True


def _record_member_added(
    tenant: Tenant, user: Any, role: str, *, actor: Actor, account_created: bool, via: str | None = None
) -> None:
    fields: dict[str, Any] = {
        "user": user.get_username(),
        "old": None,
        "new": {"role": role},
        "account_created": account_created,
    }
    if via is not None:
        fields["via"] = via
    append_server_record(tenant, Event.ADMIN_MEMBER_ADDED, fields, actor=actor)


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise DomainError("invalid_role", f"role must be one of {', '.join(Role.values)}", field="role")


def add_member(
    tenant: Tenant, email: str, role: str, password: str | None = None, *, actor: Actor
) -> Membership:
    """Make the person with `email` a member with `role` (an account is created, with `password`,
    when none exists; an existing account's credentials are never touched). An existing member's
    role is changed (and recorded as a role change); the same role again is a no-op."""
    _check_role(role)
    require_tenant(tenant)
    with transaction.atomic():
        user = User.objects.filter(email__iexact=email).first()
        existing = Membership.objects.filter(user=user).first() if user is not None else None
        if existing is not None:
            return change_member_role(existing, role, actor=actor)
        user, account_created = _user_for_email(email, password)
        membership = Membership.objects.create(tenant=tenant, user=user, role=role)
        _record_member_added(tenant, user, role, actor=actor, account_created=account_created)
        return membership


def create_api_key(
    tenant: Tenant, new: NewApiKey, *, created_by: Any = None, actor: Actor
) -> tuple[ApiKey, str]:
    """A new key and its raw value. The raw value exists only in the return value: show it once."""
    name, scopes, expires_at = new.name, new.scopes, new.expires_at
    if expires_at is not None and expires_at <= timezone.now():
        raise DomainError("invalid_expiry", "expires_at must be in the future", field="expires_at")
    prefix, raw_key = ApiKey.generate()
    creator = created_by if getattr(created_by, "pk", None) and isinstance(created_by, User) else None
    require_tenant(tenant)
    with transaction.atomic():
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
            Event.ADMIN_API_KEY_CREATED,
            {
                "prefix": prefix,
                "name": name,
                "old": None,
                "new": {"scopes": api_key.scopes, "expires_at": expires_at, "revoked_at": None},
            },
            actor=actor,
        )
    return api_key, raw_key


def revoke_api_key(api_key: ApiKey, *, actor: Actor) -> ApiKey:
    """Revoke a key (the row stays, for the audit trail); revoking a revoked key is a no-op."""
    require_tenant(api_key.tenant)
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        # Immediate in every process: the tenant's hold, before this commits, stops every
        # process reusing its copy of any of the tenant's keys (core/epoch.py); should it fail,
        # the answer waits until every copy made before the commit has aged out.
        if not epoch.hold(locked.tenant_id):
            after_commit("outwait copies of a revoked API key", lambda: time.sleep(epoch.MAX_AGE_S))
        append_server_record(
            locked.tenant,
            Event.ADMIN_API_KEY_REVOKED,
            {
                "prefix": locked.prefix,
                "name": locked.name,
                "old": {"revoked_at": None},
                "new": {"revoked_at": locked.revoked_at},
            },
            actor=actor,
        )
        api_key.revoked_at = locked.revoked_at
    return api_key


def accept_invitation(
    tenant: Tenant,
    email: str,
    role: str,
    password: str | None = None,
    *,
    nonce: str,
    actor: Actor,
) -> Membership:
    """A signed invitation was accepted: the person (created with `password` when new) joins
    `tenant` with `role`. An existing member keeps the role they already have (no change, no
    record), and an existing account keeps its password. Each invitation (its nonce) is
    accepted once."""
    _check_role(role)
    require_tenant(tenant)
    # A savepoint: a refusal after the nonce's insert (no password, the account made meanwhile)
    # undoes the insert, so the invitation stays usable.
    with transaction.atomic():
        # The insert is the check: the nonce is unique, so of several accepts at once one inserts
        # and the others wait for it, then fail here (or go ahead if it rolled back). Checking
        # first and inserting after let all of them pass the check.
        try:
            with transaction.atomic():
                InvitationUse.objects.create(nonce=nonce, email=email.lower())
        except IntegrityError:
            raise DomainError(
                "invitation_used", "this invitation has already been used", status=410, field="token"
            ) from None
        existing = User.objects.filter(email__iexact=email).first()
        if existing is None:
            if not password:
                raise DomainError("password_required", "a new account needs a password", field="password")
            try:
                with transaction.atomic():
                    user = User.objects.create_user(
                        username=email.lower(), email=email.lower(), password=password
                    )
            except IntegrityError:
                # Another invitation for this e-mail created the account a moment ago: joining
                # it needs that account's password, so sign in first.
                raise DomainError(
                    "account_exists",
                    "an account with this e-mail exists now; sign in to accept",
                    status=409,
                    field="email",
                ) from None
        else:
            user = existing
        membership, created = Membership.objects.get_or_create(user=user, defaults={"role": role})
        if created:
            _record_member_added(
                tenant, user, role, actor=actor, account_created=existing is None, via="invitation"
            )
        return membership


def _lock_owners_and(membership: Membership) -> Membership | None:
    """Lock the tenant's owner rows and `membership`'s row (in primary-key order, so two changes
    never deadlock) and return `membership` as it is now, or None if it is gone.

    Checking "another owner remains" without these locks lets two owners demote each other at
    the same moment and leave the tenant with none; with them, the second change waits for the
    first to commit and then re-checks against what it committed."""
    locked = list(
        Membership.objects.select_for_update()
        .filter(Q(role=Role.OWNER) | Q(pk=membership.pk))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    if membership.pk not in locked:
        return None
    return Membership.objects.select_related("user").get(pk=membership.pk)


def _other_owners(membership: Membership) -> bool:
    # A fresh statement: under READ COMMITTED it sees what a change we waited for committed.
    return Membership.objects.filter(role=Role.OWNER).exclude(pk=membership.pk).exists()


def change_member_role(membership: Membership, role: str, *, actor: Actor) -> Membership:
    """Give a member another role; the same role is a no-op. The last owner stays an owner
    (`last_owner`)."""
    _check_role(role)
    require_tenant(membership.tenant)
    with transaction.atomic():
        current = _lock_owners_and(membership)
        if current is None:
            raise DomainError(
                "not_a_member", "this person is no longer a member", status=404, field="membership"
            )
        if current.role == role:
            return current
        if current.role == Role.OWNER and not _other_owners(current):
            raise DomainError("last_owner", "a tenant must keep at least one owner", status=409, field="role")
        previous = current.role
        current.role = role
        current.save(update_fields=["role"])
        append_server_record(
            current.tenant,
            Event.ADMIN_MEMBER_ROLE_CHANGED,
            {"user": current.user.get_username(), "old": {"role": previous}, "new": {"role": role}},
            actor=actor,
        )
        return current


def remove_member(membership: Membership, *, actor: Actor) -> None:
    """Remove a member; one already gone is a no-op. The last owner cannot go (`last_owner`)."""
    require_tenant(membership.tenant)
    with transaction.atomic():
        current = _lock_owners_and(membership)
        if current is None:
            return
        if current.role == Role.OWNER and not _other_owners(current):
            raise DomainError("last_owner", "a tenant must keep at least one owner", status=409, field="role")
        # Their open dashboards stop hearing this tenant once the removal commits; asked first,
        # so they close before the live event of the record below reaches them.
        live.close_member_sockets(current.tenant_id, current.user_id)
        append_server_record(
            current.tenant,
            Event.ADMIN_MEMBER_REMOVED,
            {"user": current.user.get_username(), "old": {"role": current.role}, "new": None},
            actor=actor,
        )
        current.delete()
