"""Live events: on commit, a tenant's dashboards (ws/events) hear about new records and saga
state changes; another tenant's members hear nothing of them; a refused batch announces nothing."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from audit import services
from core.scoping import tenant_context
from tenants import founding
from tenants import services as services_tenants
from tenants.actors import named_actor, user_actor
from tenants.models import Role
from tests.support.chains import chain, saga_records
from tests.support.factories import PASSWORD, Person, make_person
from tests.support.live_events import events_socket, session_cookie
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.django_db(transaction=True)


async def _drain_until(communicator: WebsocketCommunicator, last_stream: str) -> list[dict[str, Any]]:
    """Every event the socket receives, up to and including the one for `last_stream`.

    Each group's messages arrive in the order they were sent, so once a tenant's own final
    marker is heard, anything published before it (a leak included) has been heard too. Bounded:
    at most 50 events, 10 s for each."""
    heard: list[dict[str, Any]] = []
    while len(heard) < 50:
        heard.append(await communicator.receive_json_from(timeout=10))
        if heard[-1].get("stream") == last_stream:
            return heard
    raise AssertionError(f"no event for {last_stream} among {len(heard)} events: {heard}")


def test_members_hear_their_tenant_only(alice: Person, carol: Person) -> None:
    tenant_c = founding.create_tenant(
        "charlie", "Charlie Freight", "founder@charlie.example", PASSWORD, actor=named_actor("test")
    )
    dave = make_person(tenant_c, "dave", Role.VIEWER)
    cookies = {"acme": session_cookie(alice), "bravo": session_cookie(carol), "charlie": session_cookie(dave)}
    tenants = {"acme": alice.tenant, "bravo": carol.tenant, "charlie": tenant_c}

    async def scenario() -> dict[str, list[dict[str, Any]]]:
        sockets = {name: events_socket(cookie) for name, cookie in cookies.items()}
        for socket in sockets.values():
            assert (await socket.connect())[0]
        ingest = database_sync_to_async(partial(in_tenant, services.ingest))
        # a refused batch first: it must not be announced
        broken = chain(saga_records("bad"))
        broken[1]["tool"] = "edited"
        with pytest.raises(services.IngestRefused):
            await ingest(alice.tenant, "refused-acme", broken, actor=named_actor("test"))
        await ingest(
            alice.tenant, "live-acme", chain(saga_records("s-acme", steps=2)), actor=named_actor("test")
        )
        await ingest(carol.tenant, "live-bravo", chain(saga_records("s-bravo")), actor=named_actor("test"))
        # Charlie ships nothing but the final marker every tenant gets.
        for name, tenant in tenants.items():
            await ingest(
                tenant, f"end-{name}", chain(saga_records(f"s-end-{name}")), actor=named_actor("test")
            )
        heard = {name: await _drain_until(socket, f"end-{name}") for name, socket in sockets.items()}
        for socket in sockets.values():
            await socket.disconnect()
        return heard

    heard = async_to_sync(scenario)()
    streams = {name: [event["stream"] for event in events] for name, events in heard.items()}
    # Each member heard exactly their own tenant's accepted batches, in order: nothing foreign,
    # nothing refused.
    assert streams == {
        "acme": ["live-acme", "end-acme"],
        "bravo": ["live-bravo", "end-bravo"],
        "charlie": ["end-charlie"],
    }
    acme_event = heard["acme"][0]
    assert acme_event["type"] == "saga.event" and acme_event["new_records"] == 6
    assert acme_event["sagas"] == [
        {"saga_id": "s-acme", "new_records": 6, "status": "completed", "previous_status": None}
    ]
    assert [c["saga_id"] for c in acme_event["state_changes"]] == ["s-acme"]
    assert acme_event["state_changes"][0]["status"] == "completed"
    saga_ids = {name: {s["saga_id"] for e in events for s in e["sagas"]} for name, events in heard.items()}
    assert saga_ids == {
        "acme": {"s-acme", "s-end-acme"},
        "bravo": {"s-bravo", "s-end-bravo"},
        "charlie": {"s-end-charlie"},
    }


def test_anonymous_socket_is_refused() -> None:
    async def scenario() -> Any:
        communicator = events_socket(None)
        connected, code = await communicator.connect()
        return connected, code

    connected, code = async_to_sync(scenario)()
    assert connected is False and code == 4401


# ------------------------------------------------------- no socket outlives the right to listen


async def _closed_with(communicator: WebsocketCommunicator) -> int:
    """The close code of the socket's next frame, which must be a close (not an event)."""
    frame = await communicator.receive_output(timeout=10)
    assert frame["type"] == "websocket.close", frame
    return int(frame["code"])


async def _ship_and_hear(listener: WebsocketCommunicator, tenant: Any, stream: str) -> list[str]:
    """Ship a batch to the tenant; the streams the listener hears up to and including it."""
    ingest = database_sync_to_async(partial(in_tenant, services.ingest))
    await ingest(tenant, stream, chain(saga_records(f"s-{stream}")), actor=named_actor("test"))
    return [event["stream"] for event in await _drain_until(listener, stream)]


def _sign_out(cookie: bytes) -> int:
    """POST /logout/ with the session the cookie names (as the browser's sign-out button)."""
    client = Client()
    client.cookies["sessionid"] = cookie.decode().split("=", 1)[1]
    return client.post("/logout/").status_code


def _remove(person: Person) -> None:
    from tenants.selectors import membership_for

    membership = membership_for(person.user, person.tenant.slug)
    assert membership is not None
    with tenant_context(person.tenant):
        services_tenants.remove_member(membership, actor=user_actor("alice"))


def test_a_removed_member_is_closed_and_hears_nothing_more(alice: Person, bob: Person) -> None:
    cookies = {"alice": session_cookie(alice), "bob": session_cookie(bob)}

    async def scenario() -> dict[str, Any]:
        sockets = {name: events_socket(cookie) for name, cookie in cookies.items()}
        for socket in sockets.values():
            assert (await socket.connect())[0]
        outcome: dict[str, Any] = {"bob_before": await _ship_and_hear(sockets["bob"], bob.tenant, "before")}
        await database_sync_to_async(_remove)(bob)
        outcome["bob_closed"] = await _closed_with(sockets["bob"])
        # The next event reaches the remaining member and not Bob: his socket left every group
        # before it closed, so no event has a way to him any more.
        outcome["alice"] = await _ship_and_hear(sockets["alice"], alice.tenant, "after")
        outcome["bob_after"] = await sockets["bob"].receive_nothing(timeout=0.5)
        for socket in sockets.values():
            await socket.disconnect()
        return outcome

    outcome = async_to_sync(scenario)()
    # Alice also heard the removal's own record in the server stream; Bob closed before it.
    assert outcome == {
        "bob_before": ["before"],
        "bob_closed": 4403,
        "alice": ["before", "server", "after"],
        "bob_after": True,
    }


def test_signing_out_closes_that_sessions_sockets_only(bob: Person) -> None:
    # Bob has the dashboard open in two browsers; he signs out of one.
    signed_out, still_in = session_cookie(bob), session_cookie(bob)

    async def scenario() -> dict[str, Any]:
        leaving, staying = events_socket(signed_out), events_socket(still_in)
        for socket in (leaving, staying):
            assert (await socket.connect())[0]
        outcome: dict[str, Any] = {"logout": await database_sync_to_async(_sign_out)(signed_out)}
        outcome["closed"] = await _closed_with(leaving)
        outcome["staying"] = await _ship_and_hear(staying, bob.tenant, "after-sign-out")
        outcome["leaving_after"] = await leaving.receive_nothing(timeout=0.5)
        # The signed-out session cannot open a new socket either.
        again = events_socket(signed_out)
        outcome["reconnect"] = await again.connect()
        for socket in (leaving, staying, again):
            await socket.disconnect()
        return outcome

    outcome = async_to_sync(scenario)()
    assert outcome == {
        "logout": 302,  # signed out, sent to the sign-in page
        "closed": 4403,
        "staying": ["after-sign-out"],
        "leaving_after": True,
        "reconnect": (False, 4401),
    }


def test_a_lost_close_message_is_covered_by_the_recheck(
    alice: Person, bob: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the close message never arrives (the channel layer was down at commit), the socket still
    stops: it re-reads its membership before forwarding (here on every event)."""
    from core import live
    from sagas.consumers import TenantEventsConsumer

    monkeypatch.setattr(TenantEventsConsumer, "recheck_seconds", 0.0)
    monkeypatch.setattr(live, "_close_group", lambda group, reason: None)  # the message is lost
    cookies = {"alice": session_cookie(alice), "bob": session_cookie(bob)}

    async def scenario() -> dict[str, Any]:
        sockets = {name: events_socket(cookie) for name, cookie in cookies.items()}
        for socket in sockets.values():
            assert (await socket.connect())[0]
        await database_sync_to_async(_remove)(bob)
        outcome = {"alice": await _ship_and_hear(sockets["alice"], alice.tenant, "after")}
        outcome["bob_closed"] = await _closed_with(sockets["bob"])  # instead of the event
        for socket in sockets.values():
            await socket.disconnect()
        return outcome

    # Bob's next event (the removal's record in the server stream) found him no longer a member.
    assert async_to_sync(scenario)() == {"alice": ["server", "after"], "bob_closed": 4403}


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"text_data": "not json"}, 1007),
        ({"text_data": "[" * 100_000}, 1007),  # too deep for the parser: RecursionError
        ({"bytes_data": b"\x00\xff"}, 1003),
        ({"text_data": '{"type": "saga.event"}'}, None),  # valid JSON: ignored, the socket stays
    ],
    ids=["text", "deep", "binary", "json"],
)
def test_a_frame_that_is_not_json_closes_the_socket_cleanly(
    alice: Person, frame: dict[str, Any], code: int | None
) -> None:
    cookie = session_cookie(alice)

    async def scenario() -> tuple[int | None, list[str]]:
        socket = events_socket(cookie)
        assert (await socket.connect())[0]
        await socket.send_to(**frame)
        if code is not None:
            # A crash in the consumer would surface here as its exception, not as a close frame.
            closed: int | None = await _closed_with(socket)
            heard: list[str] = []
        else:
            closed, heard = None, await _ship_and_hear(socket, alice.tenant, "still-open")
        await socket.disconnect()
        return closed, heard

    assert async_to_sync(scenario)() == (code, [] if code is not None else ["still-open"])


def test_a_socket_closed_for_a_bad_frame_hears_nothing_more(alice: Person) -> None:
    cookie = session_cookie(alice)

    async def scenario() -> dict[str, Any]:
        closing, staying = events_socket(cookie), events_socket(cookie)
        for socket in (closing, staying):
            assert (await socket.connect())[0]
        await closing.send_to(text_data="not json")
        outcome: dict[str, Any] = {"closed": await _closed_with(closing)}
        # Until the client answers the close, the consumer is still running: an event for the
        # tenant must not be sent on a socket it closed (the server would refuse the send).
        outcome["staying"] = await _ship_and_hear(staying, alice.tenant, "after-close")
        outcome["closing_after"] = await closing.receive_nothing(timeout=0.5)
        for socket in (closing, staying):
            await socket.disconnect()
        return outcome

    assert async_to_sync(scenario)() == {"closed": 1007, "staying": ["after-close"], "closing_after": True}
