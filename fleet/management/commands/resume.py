from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from fleet import services
from fleet.management.commands._common import refused
from tenants.actors import cli_actor
from tenants.entry import command_tenant


class Command(BaseCommand):
    help = "Lift a kill switch, by its id or every one in force with the given scope."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", type=int, help="the halt's id")
        which.add_argument("--scope", help="lift every halt in force with exactly this scope")

    def handle(self, *args: Any, **options: Any) -> None:
        # Every halt is lifted in one transaction, all or none: what was lifted is said once it
        # has committed (a refusal part-way rolls back the lifts before it, so none is reported).
        said: list[str] = []
        with command_tenant(options["tenant"]) as tenant:
            if options["id"] is not None:
                ids = [options["id"]]
            else:
                ids = [h.pk for h in services.halts_in_force() if h.scope == options["scope"]]
                if not ids:
                    raise CommandError(f"scope: no halt in force with scope '{options['scope']}'")
            for halt_id in ids:
                try:
                    lifted = services.resume(tenant, halt_id, actor=cli_actor())
                except DomainError as exc:
                    raise refused(exc) from None
                state = "lifted" if lifted is not None else "was not in force: nothing changed"
                said.append(f"halt {halt_id} of {tenant.slug} {state}")
        for line in said:
            self.stdout.write(line)
