"""A request's transaction opens after its body is read (tenants.permissions).

A client that trickles its upload must not hold a database transaction (and the pooled
connection under it) open meanwhile: a few slow agents would otherwise pin every connection of a
process and leave Postgres sessions "idle in transaction". A real client sends half a body to a
live server and stops; while the server waits for the rest, no session of this database is idle
in a transaction, and the server's thread had none open when it started reading."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.handlers.wsgi import LimitedStream
from django.db import connection

from tests.support.chains import Writer
from tests.support.factories import Person

pytestmark = pytest.mark.postgres


def _idle_in_transaction() -> list[tuple[int, str]]:
    """Other sessions of this database idle inside a transaction, as (pid, query)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%'"
        )
        return list(cursor.fetchall())


def test_a_slow_upload_holds_no_transaction(
    transactional_db: None, live_server: Any, alice: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    reading = threading.Event()
    server_side: dict[str, bool] = {}
    read = LimitedStream.read

    def watched_read(self: LimitedStream, *args: Any, **kwargs: Any) -> bytes:
        # Runs in the live server's request thread, as the view starts reading the body.
        if not reading.is_set():
            server_side["in_transaction"] = connection.in_atomic_block
            reading.set()
        return read(self, *args, **kwargs)

    monkeypatch.setattr(LimitedStream, "read", watched_read)

    writer = Writer(alice.tenant, "slow-agent")
    records = writer.records(("SAGA_START", {"saga_id": "slow-1", "name": "slow upload"}))
    body = json.dumps({"records": records}).encode()
    half = len(body) // 2
    url = urlsplit(live_server.url)
    client = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        client.putrequest("POST", "/api/v1/streams/slow-agent/records")
        client.putheader("Authorization", f"Bearer {alice.api_key}")
        client.putheader("Content-Type", "application/json")
        client.putheader("Content-Length", str(len(body)))
        client.endheaders()
        client.send(body[:half])

        assert reading.wait(timeout=30), "the server never started reading the body"
        # The server's thread now waits in the socket for the second half.
        assert server_side["in_transaction"] is False
        assert _idle_in_transaction() == []

        client.send(body[half:])
        response = client.getresponse()
        answer = json.loads(response.read())
    finally:
        client.close()
    assert response.status == 200, answer
    assert answer["accepted"] == 1 and answer["stream"] == "slow-agent"
