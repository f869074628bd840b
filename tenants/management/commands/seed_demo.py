"""A demo tenant with people in every role, an agent key, and a first history of sagas, ready for
the README's first command (which then keeps the demo agent running for live sagas).

Idempotent: a second run keeps what exists and prints the same logins. The agent key is written
to the data folder so the demo agent (and only the local machine) can use it. The first history
is made by the real demo agent (sdk/examples/demo_agent.py) writing a real WAL, which is then
ingested through the same verified ingest service the API uses."""

import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from tenants import founding, services
from tenants.actors import system_actor
from tenants.entry import command_tenant
from tenants.models import Role, Tenant

DEMO_AGENT = Path(__file__).resolve().parents[3] / "sdk" / "examples" / "demo_agent.py"
SEED_SAGAS = 12

# The demo's gate policies, sized to the demo agent (sdk/examples/demo_agent.py: a checkout every
# ~1.5 s, charges of 20 to 200 dollars): its card spend runs near this cap, so the gauge moves and
# the cap is reached now and then; the receipt pace refuses a receipt now and then. Both windows are
# a minute, so a refusal is soon followed by room again.
DEMO_BUDGET = {
    "name": "card spend per minute",
    "tool": "charge_card",
    "argument": "amount_cents",
    "max_total": 300_000,
    "window_s": 60,
}
DEMO_RATE_LIMIT = {"name": "receipt e-mails", "tool": "send_receipt", "max_calls": 24, "window_s": 60}
# Every supplier payout waits for one approver: the demo agent asks for one about every half
# minute, and waits for a decision (its request expires unanswered after 15 minutes).
DEMO_APPROVAL_POLICY = {
    "name": "supplier payouts",
    "tool": "pay_supplier",
    "predicates": [{"arg": "amount", "op": ">=", "value": 100}],
    "required_approvals": 1,
    "eligible_roles": ["owner", "admin", "approver"],
    "ttl_s": 900,
}

DEMO_SLUG = "demo"
DEMO_KEY = services.NewApiKey("demo-agent", ("ingest", "gate", "read", "recovery"))
ACTOR = system_actor("seed_demo")
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
        parser.add_argument("--sagas", type=int, default=SEED_SAGAS, help="first history (0: none)")

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"]
        if not Tenant.objects.filter(slug=DEMO_SLUG).exists():
            founding.create_tenant(DEMO_SLUG, "Demo Co", DEMO_PEOPLE[0][0], password, actor=ACTOR)
        key_file = demo_key_path()
        raw_key = ""
        # The tenant entered as every command enters it (the services assert the scope).
        with command_tenant(DEMO_SLUG) as tenant:
            for email, role in DEMO_PEOPLE:
                services.add_member(tenant, email, role, password, actor=ACTOR)
            if not key_file.exists():
                _, raw_key = services.create_api_key(tenant, DEMO_KEY, actor=ACTOR)
            _seed_policies(tenant)
            history = bool(options["sagas"]) and not _has_sagas()
        if raw_key:  # written once the key is committed
            key_file.write_text(raw_key)
            key_file.chmod(0o600)
        if history:
            records = _demo_agent_records(options["sagas"])  # another process: no transaction held
            with command_tenant(DEMO_SLUG) as tenant:
                _ingest_history(tenant, records)
            self.stdout.write(f"ingested a first history of {len(records[1])} records from the demo agent")
        self.stdout.write(f"demo tenant '{DEMO_SLUG}' ready; sign in as any of (password {password}):")
        for email, role in DEMO_PEOPLE:
            self.stdout.write(f"  {role:<9} {email}")
        self.stdout.write(f"demo agent API key in {key_file}")


def _seed_policies(tenant: Tenant) -> None:
    """The demo's budget, rate limit and approval policy, once (a second run keeps what exists,
    even if changed). Inside the tenant."""
    from approvals import services as approvals
    from approvals.models import ApprovalPolicy
    from fleet import services as fleet
    from fleet.models import BudgetLimit, RateLimit

    if not ApprovalPolicy.objects.filter(name=DEMO_APPROVAL_POLICY["name"]).exists():
        approvals.create_policy(tenant, approvals.PolicyCreate.parse(DEMO_APPROVAL_POLICY), actor=ACTOR)
    if not BudgetLimit.objects.filter(name=DEMO_BUDGET["name"]).exists():
        fleet.create_budget(tenant, fleet.BudgetCreate.parse(DEMO_BUDGET), actor=ACTOR)
    if not RateLimit.objects.filter(name=DEMO_RATE_LIMIT["name"]).exists():
        fleet.create_rate_limit(tenant, fleet.RateLimitCreate.parse(DEMO_RATE_LIMIT), actor=ACTOR)


def _has_sagas() -> bool:
    from sagas.models import Saga

    return Saga.objects.exists()


def _demo_agent_records(sagas: int) -> tuple[str, list[Any]]:
    """The WAL's stream id and records of the real demo agent run for `sagas` sagas, not shipped."""
    from sagaplane.walfile import read_all, stream_id_for

    wal = Path(settings.DATA_DIR) / "seed-agent" / "demo-agent.wal"
    wal.parent.mkdir(parents=True, exist_ok=True)
    # A separate process, as a real agent is: the demo agent's tools keep module-level state.
    subprocess.run(
        [sys.executable, str(DEMO_AGENT), "--sagas", str(sagas), "--wal", str(wal), "--no-ship", "--quiet"],
        check=False,  # partial rollbacks are part of the demo; the WAL is what matters
        capture_output=True,
        timeout=120,
    )
    entries, _ = read_all(wal)
    return stream_id_for(wal), [entry.record for entry in entries if entry.record is not None]


def _ingest_history(tenant: Tenant, records: tuple[str, list[Any]]) -> None:
    from audit.services import ingest

    stream_id, rows = records
    ingest(tenant, stream_id, rows, actor=ACTOR)
