"""Recompute the saga projection from stored records (all tenants, or one)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from core.scoping import tenant_context
from sagas.services import rebuild_tenant
from tenants.entry import tenant_by_slug
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Rebuild saga and step state from the audit records, in log order."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="slug of the one tenant to rebuild (default: all)")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options.get("tenant")
        tenants = [tenant_by_slug(slug)] if slug else list(Tenant.objects.order_by("pk"))
        for tenant in tenants:  # each in its own transaction
            with tenant_context(tenant):
                count = rebuild_tenant(tenant)
            self.stdout.write(f"{tenant.slug}: {count} saga record(s) replayed")
