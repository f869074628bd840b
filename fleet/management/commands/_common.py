"""What the fleet's management commands share: refusals as CommandError (the tenant: tenants.entry)."""

from __future__ import annotations

from django.core.management.base import CommandError

from core.errors import DomainError


def refused(exc: DomainError) -> CommandError:
    return CommandError(f"{exc.field}: {exc}")
