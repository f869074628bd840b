"""Refusals an agent's SDK made on its own (issue 29, item 3): a shipped GATE_DENY becomes a denial
of source "agent" in the one list the console reads (`fleet.actions.agent_denials`), with its tool,
agent, stream, reason and time; a GATE_DENY recording the gate's own refusal (its answer names the
gate's `decision_id`) is not listed twice; another tenant sees none of it; and the projection
costs the same number of queries for 3 refusals as for 60."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.scoping import tenant_context
from fleet import selectors
from fleet import services as fleet
from fleet.gate import GateRequest
from fleet.inputs import NewHalt
from fleet.models import GateDecision
from tenants.actors import api_key_actor, user_actor
from tests.support.chains import T0, chain
from tests.support.factories import Person
from tests.support.scoping import in_statements, in_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database_store")]

URL = "/api/v1/streams/{}/records"
LOCAL_HALT = {"scope": "tool:payroll.*", "halt_reason": "payroll freeze"}


def _ship(person: Person, stream: str, records: list[dict[str, Any]]) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = person.key_client().post(URL.format(stream), {"records": records}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] == len(records)
    return sum("sagaplane_api_key_auth" not in q["sql"] for q in queries.captured_queries)


def _deny(saga_id: str, tool: str, reason: str, answer: dict[str, Any]) -> dict[str, Any]:
    step = uuid.uuid4().hex
    return {
        "event": "GATE_DENY",
        "saga_id": saga_id,
        "step_id": step,
        "tool": tool,
        "semantics": "COMPENSABLE",
        "kwargs": {},
        "reason": reason,
        "answer": answer,
    }


def _start(saga_id: str, agent: str) -> dict[str, Any]:
    return {"event": "SAGA_START", "saga_id": saga_id, "pid": 7, "lease_ttl": 30.0, "agent": agent}


def test_a_shipped_local_refusal_is_listed_once_beside_the_gates(alice: Person, carol: Person) -> None:
    in_tenant(
        fleet.halt,
        alice.tenant,
        NewHalt(scope="tool:payroll.*", reason="payroll freeze"),
        actor=user_actor("alice"),
    )
    saga_id = uuid.uuid4().hex
    call = GateRequest(saga_id=saga_id, step_id="s1", tool="payroll.run", args={}, agent="payroll-bot")
    refused = in_statements(
        fleet.evaluate, alice.tenant, call, actor=api_key_actor("test")
    )  # the gate's own refusal
    assert refused["decision"] == "deny" and refused["decision_id"]
    _ship(
        alice,
        "wal-payroll",
        chain(
            [
                _start(saga_id, "payroll-bot"),
                _deny(saga_id, "payroll.run", "halted", refused),  # recorded by the SDK: already listed
                _deny(saga_id, "payroll.run", "halted", LOCAL_HALT),  # refused by the SDK's own view
            ]
        ),
    )
    with tenant_context(alice.tenant):
        everything = selectors.denials(tool="payroll.run")
        agent = selectors.denials(tool="payroll.run", source="agent")
        server = selectors.denials(tool="payroll.run", source="server")
    assert len(everything) == 2, [(d.source, d.detail) for d in everything]
    assert [str(d.pk) for d in server] == [refused["decision_id"]]
    (local,) = agent
    assert (local.agent, local.stream_id, local.reason, local.saga_id) == (
        "payroll-bot",
        "wal-payroll",
        "halted",
        saga_id,
    )
    assert local.detail == LOCAL_HALT
    assert local.decided_at == datetime.fromtimestamp(T0 + 3 / 1000, tz=UTC)  # the record's own time

    client = Client()
    client.force_login(alice.user)
    body = client.get("/fleet/denials/?source=agent").content.decode()
    assert body.count('data-source="agent"') == 1 and 'data-source="server"' not in body
    assert "kill switch tool:payroll.*: payroll freeze" in body and "wal-payroll" in body
    assert 'data-source="agent"' in client.get("/fleet/").content.decode()  # Recent denials

    other = Client()
    other.force_login(carol.user)
    for url in ("/fleet/denials/", "/fleet/denials/?source=agent", "/fleet/"):
        page = other.get(url).content.decode()
        assert "payroll" not in page and saga_id not in page and "wal-payroll" not in page
    with tenant_context(carol.tenant):
        assert not GateDecision.objects.exists()


def test_a_refusal_of_an_earlier_batchs_saga_is_named_and_hostile_fields_are_bounded(alice: Person) -> None:
    saga_id = uuid.uuid4().hex
    bodies = [
        _start(saga_id, "ledger-bot"),
        _deny(saga_id, "ledger.post", "control_plane_unreachable", {"message": "fleet state older"}),
        {**_deny(saga_id, "ledger.post", "x" * 500, ["not", "a", "dict"]), "ts": 2.0**52},
        {**_deny("", "ledger.post", 17, {"message": 3, "scope": {"nested": True}}), "ts": 4e9},
    ]
    records = chain(bodies)
    _ship(alice, "wal-a", records[:1])  # the saga's start in an earlier batch
    _ship(alice, "wal-a", records[1:])
    with tenant_context(alice.tenant):
        rows = {d.reason: d for d in selectors.denials(source="agent")}
    assert set(rows) == {"control_plane_unreachable", "x" * 40, "denied"}
    assert rows["control_plane_unreachable"].agent == "ledger-bot"
    assert rows["x" * 40].detail == {} and rows["denied"].detail == {"message": 3}
    assert rows["denied"].agent == ""
    # Times no clock can have, or in the future, are shown as received: never above later ones.
    assert rows["x" * 40].decided_at <= timezone.now() and rows["denied"].decided_at <= timezone.now()


@pytest.mark.postgres
def test_the_projection_costs_the_same_queries_for_3_refusals_as_for_60(alice: Person) -> None:
    def batch(n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for _ in range(n):
            saga_id = uuid.uuid4().hex
            out += [_start(saga_id, "bulk-bot"), _deny(saga_id, "bulk.call", "halted", LOCAL_HALT)]
        return out

    _ship(alice, "warm-up", chain(batch(1)))
    small, large = _ship(alice, "few", chain(batch(3))), _ship(alice, "many", chain(batch(60)))
    assert small == large, (small, large)
    with tenant_context(alice.tenant):
        assert GateDecision.objects.filter(source="agent", tool="bulk.call").count() == 64
