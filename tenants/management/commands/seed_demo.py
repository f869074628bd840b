"""A demo tenant with people in every role and an agent key, ready for the README's first command.

Idempotent: a second run keeps what exists and prints the same logins. The agent key is written
to the data folder so the demo agent (and only the local machine) can use it."""

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from tenants import services
from tenants.models import Role, Tenant

DEMO_SLUG = "demo"
DEMO_PASSWORD = "sagaplane-demo"
DEMO_PEOPLE = [
    ("owner@demo.sagaplane.local", Role.OWNER),
    ("risk@demo.sagaplane.local", Role.APPROVER),
    ("auditor@demo.sagaplane.local", Role.AUDITOR),
    ("viewer@demo.sagaplane.local", Role.VIEWER),
]


def demo_key_path() -> Path:
    return Path(settings.DATA_DIR) / "demo_api_key"


class Command(BaseCommand):
    help = "Create (or refresh) the demo tenant, its members and an agent API key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", default=DEMO_PASSWORD)

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"]
        tenant = Tenant.objects.filter(slug=DEMO_SLUG).first()
        if tenant is None:
            tenant = services.create_tenant(DEMO_SLUG, "Demo Co", DEMO_PEOPLE[0][0], password)
        for email, role in DEMO_PEOPLE:
            services.add_member(tenant, email, role, password)
        key_file = demo_key_path()
        if not key_file.exists():
            _, raw_key = services.create_api_key(
                tenant, name="demo-agent", scopes=["ingest", "gate", "read", "recovery"]
            )
            key_file.write_text(raw_key)
            key_file.chmod(0o600)
        self.stdout.write(f"demo tenant '{DEMO_SLUG}' ready; sign in as any of (password {password}):")
        for email, role in DEMO_PEOPLE:
            self.stdout.write(f"  {role:<9} {email}")
        self.stdout.write(f"demo agent API key in {key_file}")
