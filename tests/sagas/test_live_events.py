"""Live events: on commit, a tenant's dashboards (ws/events) hear about new records and saga
state changes; another tenant's members hear nothing of them; a refused batch announces nothing."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from audit import services
from controlplane.asgi import application
from tenants import services as services_tenants
from tenants.models import Role
from tests.audit.chains import chain, saga_records
from tests.conftest import PASSWORD, Person, make_person

pytestmark = pytest.mark.django_db(transaction=True)


def _cookie(person: Person) -> bytes:
    client = Client()
    client.force_login(person.user)
    session = client.session
    session["tenant_slug"] = person.tenant.slug
    session.save()
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def _communicator(cookie: bytes | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/events", headers=headers)


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
    tenant_c = services_tenants.create_tenant(
        "charlie", "Charlie Freight", "founder@charlie.example", PASSWORD, actor="test"
    )
    dave = make_person(tenant_c, "dave", Role.VIEWER)
    cookies = {"acme": _cookie(alice), "bravo": _cookie(carol), "charlie": _cookie(dave)}
    tenants = {"acme": alice.tenant, "bravo": carol.tenant, "charlie": tenant_c}

    async def scenario() -> dict[str, list[dict[str, Any]]]:
        sockets = {name: _communicator(cookie) for name, cookie in cookies.items()}
        for socket in sockets.values():
            assert (await socket.connect())[0]
        ingest = database_sync_to_async(services.ingest)
        # a refused batch first: it must not be announced
        broken = chain(saga_records("bad"))
        broken[1]["tool"] = "edited"
        with pytest.raises(services.IngestRefused):
            await ingest(alice.tenant, "refused-acme", broken, actor="test")
        await ingest(alice.tenant, "live-acme", chain(saga_records("s-acme", steps=2)), actor="test")
        await ingest(carol.tenant, "live-bravo", chain(saga_records("s-bravo")), actor="test")
        # Charlie ships nothing but the final marker every tenant gets.
        for name, tenant in tenants.items():
            await ingest(tenant, f"end-{name}", chain(saga_records(f"s-end-{name}")), actor="test")
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
        communicator = _communicator(None)
        connected, code = await communicator.connect()
        return connected, code

    connected, code = async_to_sync(scenario)()
    assert connected is False and code == 4401
