"""The queue updates live: a tenant's dashboards (ws/events) hear `approval.event` when a request
is opened and decided; another tenant's members hear nothing of it."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from tenants import services as tenants
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tests.support.approvals import Agent, vote, wire_policy
from tests.support.factories import ALL_SCOPES, Person
from tests.support.live_events import events_socket, session_cookie
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.django_db(transaction=True)


async def _approvals_until(socket: Any, done: Any) -> list[dict[str, Any]]:
    """`approval.event`s heard until `done(event)` (saga events from their records skipped);
    bounded: 60 messages, 10 s each."""
    heard: list[dict[str, Any]] = []
    for _ in range(60):
        message = await socket.receive_json_from(timeout=10)
        if message.get("type") != "approval.event":
            continue
        heard.append(message)
        if done(message):
            return heard
    raise AssertionError(f"not heard: {heard}")


def test_a_request_opened_and_decided_is_heard_by_its_tenant_only(
    agent: Agent, alice: Person, ann: Person, carol: Person
) -> None:
    wire_policy(agent.tenant)
    wire_policy(carol.tenant)
    key, raw = in_tenant(
        tenants.create_api_key,
        carol.tenant,
        NewApiKey(name="bravo-bot", scopes=ALL_SCOPES),
        actor=named_actor("test"),
    )
    bravo = Agent(carol.tenant, key.prefix, raw)
    cookies = session_cookie(alice), session_cookie(carol)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        acme, other = events_socket(cookies[0]), events_socket(cookies[1])
        assert (await acme.connect())[0] and (await other.connect())[0]
        pending = await database_sync_to_async(agent.ask)(amount=100, saga="live")
        await database_sync_to_async(vote)(ann, pending["approval_id"])
        marker = await database_sync_to_async(bravo.ask)(amount=100, saga="bravo-marker")
        heard_acme = await _approvals_until(acme, lambda m: m["kind"] == "decided")
        heard_bravo = await _approvals_until(other, lambda m: m["approval"]["id"] == marker["approval_id"])
        await acme.disconnect()
        await other.disconnect()
        return heard_acme, heard_bravo

    heard_acme, heard_bravo = async_to_sync(scenario)()
    assert [(m["kind"], m["approval"]["status"]) for m in heard_acme] == [
        ("created", "pending"),
        ("voted", "pending"),
        ("decided", "approved"),
    ]
    assert heard_acme[0]["approval"]["saga_id"] == "live" and heard_acme[0]["approval"]["args"] == {
        "amount": 100
    }
    assert [m["approval"]["saga_id"] for m in heard_bravo] == ["bravo-marker"]
