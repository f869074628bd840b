"""Founding a tenant: the one change of the tenants context with no tenant for a transport to
enter beforehand, since the tenant does not exist until it is made. So this is an entry of its own
(tests/controlplane/test_layering.py, TENANT_ENTRY_MODULES): it creates the tenant, then enters it
once, for the tenant's first audit record and its first owner (`tenants.services.add_member`,
which asserts the scope as every other service does). Callers: the `create_tenant` and `seed_demo`
commands, the benchmarks and the tests."""

from __future__ import annotations

from django.db import transaction
from sagaplane.events import Event

from core.actionaudit import append_server_record
from core.actors import Actor
from core.errors import DomainError
from core.scoping import tenant_context
from tenants import services
from tenants.models import Role, Tenant


def create_tenant(
    slug: str, name: str, owner_email: str, owner_password: str | None = None, *, actor: Actor
) -> Tenant:
    """A new tenant and its first owner, in one transaction. An existing account (matched by
    e-mail) becomes the owner as it is: a tenant action never changes anyone's credentials, so
    `owner_password` only sets the password of an account created here."""
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists():
            raise DomainError(
                "tenant_exists", f"a tenant with slug '{slug}' already exists", status=409, field="slug"
            )
        tenant = Tenant.objects.create(slug=slug, name=name)
        with tenant_context(tenant):
            append_server_record(
                tenant,
                Event.ADMIN_TENANT_CREATED,
                {"old": None, "new": {"slug": slug, "name": name}},
                actor=actor,
            )
            services.add_member(tenant, owner_email, Role.OWNER, owner_password, actor=actor)
    return tenant
