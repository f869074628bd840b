"""Recompute the saga projection from stored records (all tenants, or one)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from core.scoping import tenant_context
from sagas.services import rebuild_tenant
from tenants.entry import tenants_by_slug


class Command(BaseCommand):
    help = "Rebuild saga and step state from the audit records, in log order."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="slug of the one tenant to rebuild (default: all)")

    def handle(self, *args: Any, **options: Any) -> None:
        for tenant in tenants_by_slug(options.get("tenant")):  # each in its own transaction
            with tenant_context(tenant):
                count = rebuild_tenant(tenant)
            self.stdout.write(f"{tenant.slug}: {count} saga record(s) replayed")
