"""A websocket client of /ws/events signed in as a person (the live event tests of every app)."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane.asgi import application
from tests.support.factories import Person


def session_cookie(person: Person) -> bytes:
    client = Client()
    client.force_login(person.user)
    session = client.session
    session["tenant_slug"] = person.tenant.slug
    session.save()
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def events_socket(cookie: bytes | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/events", headers=headers)
