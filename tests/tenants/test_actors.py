"""The actor value object renders the very strings audit records have always stored, so older
records, exports and the readers of stored actors stay valid."""

from __future__ import annotations

import getpass
from typing import Any

import pytest

from core.actionaudit import append_server_record
from core.actors import Actor, ActorKind, api_key_prefix_of, shown_name
from core.scoping import tenant_context
from fleet import services as fleet
from fleet.models import Quarantine
from tenants.actors import (
    agent_saga_actor,
    api_key_actor,
    cli_actor,
    invitation_actor,
    named_actor,
    slack_actor,
    system_actor,
    user_actor,
)
from tenants.models import Tenant
from tests.support.chains import server_stream
from tests.support.scoping import in_tenant


@pytest.mark.parametrize(
    ("actor", "kind", "stored"),
    [
        (user_actor("alice"), ActorKind.USER, "user:alice"),
        (slack_actor("alice", "U0ALICE"), ActorKind.SLACK, "user:alice"),
        (invitation_actor("alice"), ActorKind.INVITATION, "user:alice (invitation)"),
        (api_key_actor("sp_ab12"), ActorKind.API_KEY, "api-key:sp_ab12"),
        (system_actor("recovery"), ActorKind.SYSTEM, "system:recovery"),
        (agent_saga_actor("as-1f"), ActorKind.AGENT_SAGA, "agent-saga:as-1f"),
        (named_actor("gate"), ActorKind.NAMED, "gate"),
    ],
)
def test_each_kind_renders_its_stored_form(actor: Actor, kind: ActorKind, stored: str) -> None:
    assert actor.kind is kind
    assert str(actor) == stored


def test_an_operator_at_a_shell_is_named_by_their_login() -> None:
    assert str(cli_actor()) == f"cli:{getpass.getuser()}"


def test_a_slack_user_is_the_same_person_in_the_evidence_but_shown_as_who_came_in() -> None:
    from_slack, signed_in = slack_actor("alice", "U0ALICE"), user_actor("alice")
    assert str(from_slack) == str(signed_in)
    assert from_slack != signed_in  # the values differ: how they came in
    assert shown_name(from_slack) == "alice (Slack U0ALICE)"
    assert shown_name(signed_in) == shown_name("user:alice") == "alice"


def test_stored_actors_are_read_back() -> None:
    assert api_key_prefix_of(api_key_actor("sp_ab12")) == api_key_prefix_of("api-key:sp_ab12") == "sp_ab12"
    assert api_key_prefix_of(user_actor("alice")) == api_key_prefix_of("gate") == ""
    assert shown_name("system:recovery") == "system:recovery"


def test_an_actor_is_a_frozen_value() -> None:
    actor = user_actor("alice")
    with pytest.raises(AttributeError):
        actor.id = "mallory"  # type: ignore[misc]
    assert actor == user_actor("alice") and hash(actor) == hash(user_actor("alice"))


def test_an_operator_named_in_a_test_keeps_that_name() -> None:
    assert str(cli_actor("ops")) == "cli:ops"


@pytest.mark.django_db
@pytest.mark.parametrize("plain", ["user:alice", "test", None, 5])
def test_the_audit_writer_and_the_stores_refuse_anything_but_an_actor(tenant_a: Tenant, plain: Any) -> None:
    """A plain string (or anything else) never reaches a record or a column: a TypeError naming
    the function handed it, and nothing written."""
    before = len(server_stream(tenant_a))
    with pytest.raises(TypeError, match=r"^core\.actionaudit\.append_server_records: actor must be"):
        append_server_record(tenant_a, "SAGA_NOTE", {"saga_id": "s"}, actor=plain)
    terms = fleet.QuarantineCreate.parse({"reason": "r", "preemptive": True})
    with pytest.raises(TypeError, match=r"^fleet\.actions\.quarantine\.quarantine: actor must be"):
        in_tenant(fleet.quarantine, tenant_a, "aside", terms, actor=plain)
    with tenant_context(tenant_a):
        assert not Quarantine.objects.exists()
    assert len(server_stream(tenant_a)) == before
