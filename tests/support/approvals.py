"""Approvals helpers for tests: an agent's key asking the gate (Agent), an approval policy on large
wires (wire_policy), a member's vote (vote), and the membership a vote is cast as (member). The
fixtures that make alice's agent and the approvers are in tests/approvals/conftest.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals import services as approvals
from core.scoping import tenant_context
from fleet import services as fleet
from fleet.gate import GateRequest
from tenants import services as tenants
from tenants.actors import api_key_actor, named_actor, user_actor
from tenants.inputs import NewApiKey
from tenants.models import Membership, Tenant
from tests.support.factories import ALL_SCOPES, Person
from tests.support.scoping import in_statements, in_tenant


def member(person: Person) -> Membership:
    with tenant_context(person.tenant):
        return Membership.objects.select_related("user", "tenant").get(user=person.user)


@dataclass
class Agent:
    tenant: Tenant
    prefix: str
    raw_key: str

    def ask(
        self, tool: str = "bank.wire", *, saga: str = "s1", step: str = "1", key: str = "", **args: Any
    ) -> dict[str, Any]:
        call = GateRequest(
            saga_id=saga,
            step_id=step,
            tool=tool,
            args=args,
            semantics="IRREVERSIBLE",
            agent="payments-bot",
            api_key_prefix=self.prefix,
            client_idempotency_key=key,
        )
        return in_statements(fleet.evaluate, self.tenant, call, actor=api_key_actor(self.prefix))


def payments_agent(requester: Person) -> Agent:
    """The payments agent's key, created by `requester`: the requester of what it asks."""
    key, raw = in_tenant(
        tenants.create_api_key,
        requester.tenant,
        NewApiKey(name="payments-bot", scopes=ALL_SCOPES),
        created_by=requester.user,
        actor=named_actor("test"),
    )
    return Agent(requester.tenant, key.prefix, raw)


def wire_policy(tenant: Tenant, **overrides: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "large wires",
        "tool": "bank.*",
        "predicates": [{"arg": "amount", "op": ">", "value": 50}],
        "required_approvals": 1,
    }
    return in_tenant(
        approvals.create_policy,
        tenant,
        approvals.PolicyCreate.parse({**{**fields, **overrides}}),
        actor=user_actor("alice"),
    )


def vote(person: Person, approval_id: str, choice: str = "approve", note: str = "", **kwargs: Any) -> Any:
    return in_tenant(
        approvals.vote,
        person.tenant,
        approval_id,
        member(person),
        choice,
        note,
        actor=user_actor(person.user.email),
        **kwargs,
    )
