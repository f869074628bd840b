from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from core.errors import DomainError
from fleet import services
from fleet.management.commands._common import refused
from tenants.actors import cli_actor
from tenants.entry import command_tenant


class Command(BaseCommand):
    help = "Engage a kill switch: every matching gate call is refused (drain: new sagas only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--scope", required=True, help='"*", "tool:<glob>", "tag:<t>" or "agent:<name>"')
        parser.add_argument("--reason", required=True, help="why (recorded, shown to agents and people)")
        parser.add_argument("--mode", choices=["halt", "drain"], default="halt")
        parser.add_argument("--ttl", type=int, default=None, help="lift by itself after this many seconds")

    def handle(self, *args: Any, **options: Any) -> None:
        with command_tenant(options["tenant"]) as tenant:
            try:
                row = services.halt(
                    tenant,
                    services.HaltCreate.parse(
                        {
                            "scope": options["scope"],
                            "reason": options["reason"],
                            "mode": options["mode"],
                            "ttl_s": options["ttl"],
                        }
                    ),
                    actor=cli_actor(),
                )
            except DomainError as exc:
                raise refused(exc) from None
            until = f" until {row.expires_at.isoformat()}" if row.expires_at else ""
            self.stdout.write(f"{row.mode} {row.scope} in force for {tenant.slug}{until} (id {row.pk})")
