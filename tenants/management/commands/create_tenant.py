from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from tenants import founding
from tenants.actors import cli_actor


class Command(BaseCommand):
    help = "Create a tenant and its first owner."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)
        parser.add_argument("--owner-email", required=True)
        parser.add_argument("--owner-password", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = founding.create_tenant(
                options["slug"],
                options["name"],
                options["owner_email"],
                options["owner_password"],
                actor=cli_actor(),
            )
        except DomainError as exc:
            raise CommandError(f"{exc.field}: {exc}") from exc
        self.stdout.write(f"created tenant {tenant.slug} owned by {options['owner_email']}")
