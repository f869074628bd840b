"""Recompute the saga projection from stored records (all tenants, or one)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sagas.services import rebuild_tenant
from tenants.models import Tenant


class Command(BaseCommand):
    help = "Rebuild saga and step state from the audit records, in log order."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="slug of the one tenant to rebuild (default: all)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenants = Tenant.objects.order_by("pk")
        if options.get("tenant"):
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"no tenant '{options['tenant']}'")
        for tenant in tenants:
            count = rebuild_tenant(tenant)
            self.stdout.write(f"{tenant.slug}: {count} saga record(s) replayed")
