from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from fleet import services
from fleet.management.commands._common import refused
from fleet.models import CircuitBreaker
from tenants.actors import cli_actor
from tenants.entry import command_tenant


class Command(BaseCommand):
    help = "Circuit breakers: list them, create one, or delete one (by name)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("list", help="every breaker with its state")
        create = actions.add_parser("create", help="a closed breaker for the tools matching a glob")
        create.add_argument("--name", required=True)
        create.add_argument("--tool", required=True, help="a glob, matched like halts (NFKC, any case)")
        create.add_argument("--consecutive-failures", type=int, required=True)
        create.add_argument("--failure-rate", required=True, help="e.g. 0.5")
        create.add_argument("--min-volume", type=int, required=True)
        create.add_argument("--window", type=int, required=True, help="seconds")
        create.add_argument("--cool-down", type=int, required=True, help="seconds")
        delete = actions.add_parser("delete", help="delete a breaker")
        delete.add_argument("--name", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        with command_tenant(options["tenant"]) as tenant:
            action = options["action"]
            try:
                if action == "create":
                    fields = {
                        "name": options["name"],
                        "tool": options["tool"],
                        "consecutive_failures": options["consecutive_failures"],
                        "failure_rate": options["failure_rate"],
                        "min_volume": options["min_volume"],
                        "window_s": options["window"],
                        "cool_down_s": options["cool_down"],
                    }
                    row = services.create_breaker(
                        tenant, services.BreakerCreate.parse(fields), actor=cli_actor()
                    )
                    self.stdout.write(
                        f"breaker {row.name} on {row.tool} created for {tenant.slug} (id {row.pk})"
                    )
                    return
                rows = list(CircuitBreaker.objects.order_by("name"))
                if action == "list":
                    for row in rows:
                        self.stdout.write(f"{row.name}\t{row.tool}\t{services.breaker_phase(row)}")
                    return
                match = [row for row in rows if row.name == options["name"]]
                if not match:
                    raise CommandError(f"name: no breaker named '{options['name']}'")
                services.delete_breaker(tenant, match[0].pk, actor=cli_actor())
                self.stdout.write(f"breaker {options['name']} deleted for {tenant.slug}")
            except DomainError as exc:
                raise refused(exc) from None
