"""The approval inbox over HTTP (issue 29, item 1): the requester's reason taken from the gate call
and shown first, amounts with separators and the call's currency, vote times, a heading that
follows the request's state, and the navigation's pending count, scoped to the tenant."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from core.numbers import amount_text
from core.scoping import tenant_context
from fleet import services as fleet
from fleet.calls import gate_call
from tenants.actors import api_key_actor
from tests.support.approvals import Agent, vote, wire_policy
from tests.support.chains import server_stream
from tests.support.factories import Person
from tests.support.scoping import in_statements

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database_store")]
REASON = "Supplier invoice 2026-114, due today"


def _ask(agent: Agent, saga: str = "s1", **body: Any) -> dict[str, Any]:
    call = gate_call(
        {
            "saga_id": saga,
            "step_id": "1",
            "tool": "bank.wire",
            "semantics": "IRREVERSIBLE",
            "args": {"amount": 250_000, "currency": "EUR", "to": "ACME GmbH"},
            "agent": "payments-bot",
            **body,
        },
        agent.prefix,
    )
    return in_statements(fleet.evaluate, agent.tenant, call, actor=api_key_actor(agent.prefix))


def _client(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


@pytest.mark.parametrize(
    ("value", "currency", "shown"),
    [
        (250_000, "EUR", "250,000 EUR"),
        (1234.5, None, "1,234.50"),
        (25000, " usd ", "25,000 usd"),
        (7, 12, "7"),  # a currency that is no text is not shown
        (None, "EUR", "—"),
        ("n/a", "EUR", "n/a"),
        (True, None, "True"),
        (10**400, None, str(10**400)),  # beyond a float: shown as given, never an error
    ],
)
def test_amounts_read_with_separators_and_the_calls_currency(value: Any, currency: Any, shown: str) -> None:
    assert amount_text(value, currency) == shown


def test_the_reason_is_kept_recorded_and_shown_first(agent: Agent, alice: Person) -> None:
    wire_policy(agent.tenant, required_approvals=2)
    answer = _ask(agent, reason=REASON)
    approval_id = answer["approval_id"]
    with tenant_context(agent.tenant):
        assert ApprovalRequest.objects.get(pk=approval_id).reason == REASON
    requested = [r for r in server_stream(agent.tenant) if r["event"] == "APPROVAL_REQUESTED"]
    assert requested[-1]["reason"] == REASON
    client = _client(alice)
    queue = client.get("/approvals/rows").content.decode()
    assert REASON in queue and "250,000 EUR" in queue
    page = client.get(f"/approvals/{approval_id}/").content.decode()
    assert page.index('id="approval-reason"') < page.index('id="approval-action"')
    assert "Approve <code>bank.wire</code>?" in page and "250,000 EUR" in page
    # The reason is not part of the call's identity: asked again with other words, the same request.
    assert _ask(agent, reason="another reason")["approval_id"] == approval_id
    assert client.get(f"/api/v1/approvals/{approval_id}").json()["reason"] == REASON


@pytest.mark.parametrize("reason", [7, "x" * 501, "nul\x00"])
def test_a_reason_that_is_no_short_text_is_refused(agent: Agent, reason: Any) -> None:
    from core.errors import DomainError

    with pytest.raises(DomainError) as refused:
        _ask(agent, reason=reason)
    assert refused.value.status == 400 and refused.value.field == "reason"


def test_votes_show_their_time_and_the_heading_follows_the_state(
    agent: Agent, alice: Person, ann: Person
) -> None:
    wire_policy(agent.tenant, required_approvals=1)
    approval_id = _ask(agent)["approval_id"]
    vote(ann, approval_id, note="checked the invoice")
    state = _client(alice).get(f"/approvals/{approval_id}/state").content.decode()
    assert "never" not in state
    assert "<time datetime=" in state and " UTC" in state
    assert "<code>bank.wire</code>: approved, not started yet" in state
    assert "Approve <code>bank.wire</code>?" not in state
    assert _ask(agent)["decision"] == "allow"
    state = _client(alice).get(f"/approvals/{approval_id}/state").content.decode()
    assert "approved and started" in state and "1 of 1" in state and "consumed" in state


def test_the_navigation_counts_pending_requests_of_the_tenant_only(
    agent: Agent, alice: Person, bob: Person, carol: Person
) -> None:
    wire_policy(agent.tenant, required_approvals=1)
    for saga in ("s1", "s2"):
        _ask(agent, saga=saga)
    for person in (alice, bob):  # every member reads the queue, so every member sees the count
        page = _client(person).get("/sagas/").content.decode()
        assert 'data-live-url="/approvals/pending-badge"' in page
        assert '<span class="sr-only">, </span>2<span class="sr-only"> pending</span>' in page
    assert _client(carol).get("/approvals/pending-badge").content == b""
    assert 'id="approvals-pending"' in (carol_page := _client(carol).get("/sagas/").content.decode())
    assert "pending</span>" not in carol_page


@pytest.mark.parametrize(
    ("capability", "roles"),
    [("fleet", "owners and admins"), ("approve", "owners, admins and approvers"), ("nothing", "nobody")],
)
def test_roles_are_named_from_the_capability_table(capability: str, roles: str) -> None:
    from frontend.templatetags.sagaplane_ui import who_may

    assert who_may(capability) == roles


def test_a_role_without_the_action_is_told_who_has_it(agent: Agent, bob: Person, ann: Person) -> None:
    wire_policy(agent.tenant, required_approvals=1)
    approval_id = _ask(agent)["approval_id"]
    viewer = _client(bob)
    assert (
        "Votes are cast by owners, admins and approvers."
        in viewer.get(f"/approvals/{approval_id}/").content.decode()
    )
    assert (
        "Approval policies are set by owners and admins"
        in viewer.get("/approvals/policies/").content.decode()
    )
    fleet_page = _client(ann).get("/fleet/").content.decode()
    assert "Budgets, rate limits and circuit breakers are set by owners and admins." in fleet_page
    assert "kill switches are engaged" not in fleet_page  # an approver engages them
    assert 'id="vote-role-note"' not in _client(ann).get(f"/approvals/{approval_id}/").content.decode()
