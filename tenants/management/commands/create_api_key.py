from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from tenants import services
from tenants.actors import cli_actor
from tenants.entry import command_tenant
from tenants.models import Scope


class Command(BaseCommand):
    help = "Create an API key for a tenant's agents. The key is printed alone on the last line, once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--name", required=True)
        parser.add_argument(
            "--scopes",
            default="ingest,gate,read,recovery",
            help=f"comma-separated, from: {', '.join(Scope.values)} (default: %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        try:
            with command_tenant(options["tenant"]) as tenant:
                api_key, raw_key = services.create_api_key(
                    tenant,
                    services.ApiKeyCreate.parse({"name": options["name"], "scopes": scopes}),
                    actor=cli_actor(),
                )
        except DomainError as exc:
            raise CommandError(f"{exc.field}: {exc}") from exc
        self.stdout.write(f"created API key '{api_key.name}' with scopes {','.join(api_key.scopes)}")
        self.stdout.write("the key is shown once; only its hash is stored:")
        self.stdout.write(raw_key)
