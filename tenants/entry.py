"""How a Celery task and a management command enter a tenant: once, at the transport, as the view
mixin (`tenants.permissions.TenantScopedViewMixin`) does for a request. The services and actions
they call assert the scope (`core.scoping.require_tenant`) instead of opening one.

- a task: `@tenant_task` under `@shared_task`; the task is sent the tenant's id first, the body
  gets the `Tenant`, inside `tenant_context` (one transaction as the tenant) unless it asks for
  `transaction=False` (a body that waits on the network between its transactions: a webhook POST,
  a Slack call, a witness; it enters `tenant_context` around each unit of work itself);
- a command: `with command_tenant(slug) as tenant:` (CommandError when no tenant has the slug);
- a change that belongs to no tenant but is recorded in several (a person's passkey, in every
  tenant they belong to): `in_each_tenant(tenants, work)`, inside the change's transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Concatenate, ParamSpec, TypeVar

from django.core.management.base import CommandError

from core.scoping import tenant_context
from tenants.models import Tenant

P = ParamSpec("P")
R = TypeVar("R")


def tenant_by_id(tenant_id: int) -> Tenant | None:
    """The tenant a task was sent, or None when it is gone since (the task then does nothing)."""
    return Tenant.objects.filter(pk=tenant_id).first()


def tenant_task(
    *, transaction: bool = True
) -> Callable[[Callable[Concatenate[Tenant, P], R]], Callable[Concatenate[int, P], R | None]]:
    """A task body that acts in one tenant, called with the tenant's id (see the module)."""

    def decorate(body: Callable[Concatenate[Tenant, P], R]) -> Callable[Concatenate[int, P], R | None]:
        @functools.wraps(body)
        def run(tenant_id: int, /, *args: P.args, **kwargs: P.kwargs) -> R | None:
            tenant = tenant_by_id(tenant_id)
            if tenant is None:
                return None
            if not transaction:
                return body(tenant, *args, **kwargs)
            with tenant_context(tenant):
                return body(tenant, *args, **kwargs)

        return run

    return decorate


def tenant_by_slug(slug: str) -> Tenant:
    """A command's `--tenant`, or CommandError when no tenant has that slug."""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"tenant: no tenant with slug '{slug}'")
    return tenant


def tenants_by_slug(slug: str | None) -> list[Tenant]:
    """A command's optional `--tenant`: that tenant, or every tenant (oldest first) without one."""
    return [tenant_by_slug(slug)] if slug else list(Tenant.objects.order_by("pk"))


@contextmanager
def command_tenant(slug: str) -> Iterator[Tenant]:
    """A management command's tenant, by slug, entered (`tenant_context`) for the block."""
    tenant = tenant_by_slug(slug)
    with tenant_context(tenant):
        yield tenant


def in_each_tenant(tenants: Iterable[Tenant], work: Callable[[Tenant], object]) -> None:
    """`work(tenant)` for each of `tenants` in turn, each tenant entered (`tenant_context`: a
    savepoint and its SET LOCAL inside the caller's transaction) for its own work alone, so what
    every tenant records commits or rolls back with the caller's change."""
    for tenant in tenants:
        with tenant_context(tenant):
            work(tenant)
