from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from core.errors import DomainError
from fleet import services
from fleet.management.commands._common import refused
from tenants.actors import cli_actor
from tenants.entry import command_tenant


class Command(BaseCommand):
    help = "Set one saga aside: the gate refuses its steps and recovery skips it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("saga_id")
        parser.add_argument("--reason", required=True)
        parser.add_argument(
            "--preemptive",
            action="store_true",
            help="set aside a saga no record has named yet (refused without this flag)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with command_tenant(options["tenant"]) as tenant:
            try:
                terms = services.QuarantineCreate.parse(
                    {"reason": options["reason"], "preemptive": options["preemptive"]}
                )
                row = services.quarantine(tenant, options["saga_id"], terms, actor=cli_actor())
            except DomainError as exc:
                raise refused(exc) from None
            preemptive = " (preemptively: no record of it yet)" if row.preemptive else ""
            self.stdout.write(f"saga {row.saga_id} of {tenant.slug} is quarantined{preemptive}")
