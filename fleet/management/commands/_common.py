"""What the fleet's management commands share: the tenant by slug, refusals as CommandError."""

from __future__ import annotations

from django.core.management.base import CommandError

from core.errors import DomainError
from tenants.models import Tenant


def tenant_by_slug(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"tenant: no tenant with slug '{slug}'")
    return tenant


def refused(exc: DomainError) -> CommandError:
    return CommandError(f"{exc.field}: {exc}")
