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
from tests.audit.chains import chain, saga_records
from tests.conftest import Person

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


def test_members_hear_their_tenant_only(alice: Person, carol: Person) -> None:
    alice_cookie, carol_cookie = _cookie(alice), _cookie(carol)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        acme, bravo = _communicator(alice_cookie), _communicator(carol_cookie)
        assert (await acme.connect())[0] and (await bravo.connect())[0]
        ingest = database_sync_to_async(services.ingest)
        # a refused batch first: it must not be announced
        broken = chain(saga_records("bad"))
        broken[1]["tool"] = "edited"
        with pytest.raises(services.IngestRefused):
            await ingest(alice.tenant, "live", broken, actor="test")
        await ingest(alice.tenant, "live", chain(saga_records("s-live", steps=2)), actor="test")
        await ingest(carol.tenant, "other", chain(saga_records("s-bravo")), actor="test")
        heard_by_acme = await acme.receive_json_from(timeout=5)
        heard_by_bravo = await bravo.receive_json_from(timeout=5)
        await acme.disconnect()
        await bravo.disconnect()
        return heard_by_acme, heard_by_bravo

    acme_event, bravo_event = async_to_sync(scenario)()
    assert acme_event["type"] == "saga.event" and acme_event["stream"] == "live"
    assert acme_event["sagas"] == [
        {"saga_id": "s-live", "new_records": 6, "status": "completed", "previous_status": None}
    ]
    assert acme_event["state_changes"][0]["status"] == "completed"
    # carol's first event is bravo's own: acme's (sent earlier) never reached her
    assert bravo_event["stream"] == "other" and bravo_event["sagas"][0]["saga_id"] == "s-bravo"


def test_anonymous_socket_is_refused() -> None:
    async def scenario() -> Any:
        communicator = _communicator(None)
        connected, code = await communicator.connect()
        return connected, code

    connected, code = async_to_sync(scenario)()
    assert connected is False and code == 4401
