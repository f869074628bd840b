from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet import services
from fleet.stores import RedisStore
from tenants.entry import tenants_by_slug


class Command(BaseCommand):
    help = (
        "Rebuild the gate's Redis counters from the ledger of authorisations (also done by itself "
        "when Redis is found empty). Refuses calls of the tenant for a moment while it runs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="the tenant's slug (default: every tenant)")

    def handle(self, *args: Any, **options: Any) -> None:
        store = services.get_store()
        if not isinstance(store, RedisStore):
            self.stdout.write(
                "the gate uses the database store: its counters are the database, nothing to rebuild"
            )
            return
        for tenant in tenants_by_slug(options["tenant"]):
            rebuilt = store.rebuild(tenant.pk, force=True, tag=services.gate_tag(tenant))
            self.stdout.write(
                f"{tenant.slug}: {'rebuilt' if rebuilt else 'being rebuilt by another process'}"
            )
