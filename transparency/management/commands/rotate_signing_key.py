from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tenants.actors import cli_actor
from tenants.entry import command_tenant
from transparency import services


class Command(BaseCommand):
    help = (
        "Rotate a tenant's log signing key: a new key signs, the old one co-signs until "
        "--finish. Both steps are recorded in the tenant's server stream."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument(
            "--finish",
            action="store_true",
            help="end a rotation: retiring keys stop co-signing (they still verify old checkpoints)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with command_tenant(options["tenant"]) as tenant:
            if options["finish"]:
                retired = services.finish_key_rotation(tenant, actor=cli_actor())
                if retired:
                    self.stdout.write(
                        f"retired {retired} key(s) of {tenant.slug}; the active key signs alone"
                    )
                else:
                    self.stdout.write(f"no rotation under way for {tenant.slug}: nothing changed")
                return
            key = services.rotate_signing_key(tenant, actor=cli_actor())
            verifier_keys = services.current_verifier_keys()
        self.stdout.write(f"new signing key {key.key_id} is active for {tenant.slug}; the old key co-signs")
        self.stdout.write("verifier keys (give the new one to verifiers, then run again with --finish):")
        for verifier_key in verifier_keys:
            self.stdout.write(verifier_key)
