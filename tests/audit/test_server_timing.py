"""An ingest answer says where its time went (Server-Timing), phase by phase; other answers of
the API carry no such header."""

from __future__ import annotations

from django.db import connection

from core.timing import parse_header
from tests.support.chains import chain, saga_records
from tests.support.factories import Person

PHASES = {"parse", "verify", "rows", "projection_fold", "insert_locked", "projection_write", "commit"}


def test_ingest_answer_carries_its_phases(alice: Person) -> None:
    client = alice.key_client()
    response = client.post(
        "/api/v1/streams/t/records", {"records": chain(saga_records(steps=2))}, format="json"
    )
    assert response.status_code == 200, response.content
    phases = parse_header(response["Server-Timing"])
    assert set(phases) >= PHASES, phases
    # Postgres: the wait for the tenant log lock is its own phase (the appends serialise on it).
    assert ("log_lock" in phases) == (connection.vendor == "postgresql")
    assert all(ms >= 0 for ms in phases.values())
    assert "Server-Timing" not in client.get("/api/v1/tenant")


def test_a_refused_batch_is_timed_too(alice: Person) -> None:
    records = chain(saga_records(steps=1))
    records[1]["seq"] = 99  # the chain breaks at the second record
    response = alice.key_client().post("/api/v1/streams/t/records", {"records": records}, format="json")
    assert response.status_code == 422
    assert {"parse", "verify", "commit"} <= set(parse_header(response["Server-Timing"]))


def test_parse_header_reads_durations() -> None:
    assert parse_header("a;dur=1.5, b;desc=x;dur=2, c") == {"a": 1.5, "b": 2.0}
