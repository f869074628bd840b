"""The gate and the fleet's policies over HTTP: shapes, who may do what, hostile bodies, the
long-poll that carries a halt to a waiting agent, and a third tenant that sees nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection

from core.scoping import tenant_context
from fleet import services
from fleet.models import GateDecision
from tenants import founding
from tenants.actors import named_actor
from tenants.models import Role, Tenant
from tests.support.factories import Person, make_person, scoped_key_client
from tests.support.scoping import in_tenant

NO_RESERVATIONS = {"reserved": "0", "settled": "0", "overrun": "0"}

EVALUATE = "/api/v1/gate/evaluate"
STATUS = "/api/v1/fleet/status"


pytestmark = pytest.mark.usefixtures("database_store")


def gate_call(n: int, tool: str = "stripe.charge", **args: Any) -> dict[str, Any]:
    return {"saga_id": f"saga-{n}", "step_id": "1", "tool": tool, "args": args, "agent": "billing-bot"}


def test_an_agent_is_held_to_a_budget_set_by_an_owner(alice: Person) -> None:
    owner = alice.session_client()
    created = owner.post(
        "/api/v1/fleet/budgets",
        {"name": "daily stripe", "tool": "stripe.*", "max_total": "50000", "window_s": 86400},
        format="json",
    )
    assert created.status_code == 201, created.json()
    agent = scoped_key_client(alice.tenant, "gate")
    answers = [agent.post(EVALUATE, gate_call(n, amount=20_000), format="json") for n in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["decision"] for a in answers] == ["allow", "allow", "deny"]
    refusal = answers[2].json()
    assert (
        refusal["reason"] == "budget_exceeded"
        and refusal["remaining"] == "10000"
        and refusal["limit"] == "daily stripe"
    )
    # The same call again: the same authorisation, nothing more spent.
    again = agent.post(EVALUATE, gate_call(0, amount=20_000), format="json").json()
    assert again == answers[0].json()
    usage = owner.get("/api/v1/fleet/budgets").json()[0]["usage"]
    assert usage == [
        {"scope": "fleet", "used": "40000", "leased": "0", **NO_RESERVATIONS, "cap": "50000", "ratio": 0.8}
    ]


@pytest.mark.parametrize(
    "body, field",
    [
        ([1, 2], "body"),
        ({"step_id": "1", "tool": "t"}, "saga_id"),
        ({"saga_id": "s", "step_id": "1", "tool": ""}, "tool"),
        ({"saga_id": "s", "step_id": "1", "tool": "t", "args": [1]}, "args"),
        ({"saga_id": "s", "step_id": "1", "tool": "t", "tags": "urgent"}, "tags"),
        ({"saga_id": "s" * 129, "step_id": "1", "tool": "t"}, "saga_id"),
        ({"saga_id": "a\x00b", "step_id": "1", "tool": "t"}, "saga_id"),
        ({"saga_id": 5, "step_id": "1", "tool": "t"}, "saga_id"),
    ],
)
def test_a_malformed_gate_call_is_a_400_naming_its_field_and_records_nothing(
    alice: Person, body: Any, field: str
) -> None:
    response = scoped_key_client(alice.tenant, "gate").post(EVALUATE, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid" and response.json()["field"] == field
    with tenant_context(alice.tenant):
        assert not GateDecision.objects.exists()


def test_uncountable_amounts_over_http_are_refused(alice: Person) -> None:
    in_tenant(
        services.create_budget,
        alice.tenant,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 60}),
        actor=named_actor("test"),
    )
    agent = scoped_key_client(alice.tenant, "gate")
    for n, amount in enumerate([-5, "12", True, None, 10**30, 1e308]):
        answer = agent.post(EVALUATE, gate_call(n, amount=amount), format="json").json()
        assert answer["decision"] == "deny" and answer["reason"] == "invalid_argument", amount
    assert agent.post(EVALUATE, gate_call(99, amount=100), format="json").json()["decision"] == "allow"


def test_who_may_do_what(alice: Person, tenant_a: Tenant) -> None:
    viewer = make_person(tenant_a, "vera", Role.VIEWER).session_client()
    approver = make_person(tenant_a, "april", Role.APPROVER).session_client()
    budget = {"name": "b", "max_total": 10, "window_s": 60}
    assert viewer.get("/api/v1/fleet/budgets").status_code == 200
    assert viewer.post("/api/v1/fleet/budgets", budget, format="json").status_code == 403
    assert viewer.post("/api/v1/fleet/halts", {"scope": "*", "reason": "r"}, format="json").status_code == 403
    assert approver.post("/api/v1/fleet/budgets", budget, format="json").status_code == 403
    halt = approver.post("/api/v1/fleet/halts", {"scope": "tool:email.*", "reason": "spam"}, format="json")
    assert halt.status_code == 201 and halt.json()["actor"] == "user:april@acme.example"
    assert (
        scoped_key_client(tenant_a, "read").post("/api/v1/fleet/budgets", budget, format="json").status_code
        == 403
    )
    assert (
        scoped_key_client(tenant_a, "gate")
        .post("/api/v1/fleet/halts", {"scope": "*", "reason": "r"})
        .status_code
        == 403
    )
    assert (
        scoped_key_client(tenant_a, "control")
        .post("/api/v1/fleet/budgets", budget, format="json")
        .status_code
        == 201
    )
    assert alice.session_client().post(EVALUATE, gate_call(1), format="json").status_code == 403
    resumed = approver.delete(f"/api/v1/fleet/halts/{halt.json()['id']}")
    assert resumed.status_code == 204
    assert approver.get("/api/v1/fleet/halts").json() == []


# Postgres: the waiting request reads from its own thread's connection while the test writes the
# halt, and SQLite's in-memory test database (one shared cache) locks the table between the two
# ("database table is locked"), which a real embedded database file (WAL) does not.
@pytest.mark.postgres
def test_a_halt_reaches_a_waiting_long_poll(transactional_db: None) -> None:
    tenant = founding.create_tenant(
        "poll", "Poll", "owner@poll.example", "correct-horse-battery", actor=named_actor("test")
    )
    agent = scoped_key_client(tenant, "gate")
    first = agent.get(STATUS).json()
    assert first["halts"] == []
    result: dict[str, Any] = {}

    def wait() -> None:
        started = time.monotonic()
        try:
            result["answer"] = agent.get(STATUS, {"since": first["version"], "wait": 20}).json()
            result["waited"] = time.monotonic() - started
        finally:
            connection.close()

    waiter = threading.Thread(target=wait)
    waiter.start()
    in_tenant(
        services.halt,
        tenant,
        services.HaltCreate.parse({"scope": "tool:stripe.*", "reason": "incident"}),
        actor=named_actor("test"),
    )
    waiter.join(timeout=60)
    answer = result["answer"]
    assert answer["version"] != first["version"]
    assert [h["scope"] for h in answer["halts"]] == ["tool:stripe.*"]
    assert result["waited"] < 20  # woken by the change, not by the end of its wait


class VirtualClock:
    """Stands in for the long-poll's `time`: sleeping moves the clock, no real time passes."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_halt_committed_while_the_long_poll_reads_the_state_wakes_it(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race bench/gate.py caught (a halt reached the SDK after ~1.08 s): a halt committed
    after the long-poll read the state but before it read the change counter was only seen at the
    once-a-second re-read. The counter is read before the state, so the change wakes the wait."""
    from fleet import api

    tenant = founding.create_tenant("race", "Race", "owner@race.example", actor=named_actor("test"))
    agent = scoped_key_client(tenant, "gate")
    before = agent.get(STATUS).json()
    reads = 0

    def status_then_a_halt_commits() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        state = read_status()
        if reads == 1:  # another process's halt lands just after this read
            in_tenant(
                services.halt,
                tenant,
                services.HaltCreate.parse({"scope": "tool:stripe.*", "reason": "incident"}),
                actor=named_actor("test"),
            )
        return state

    read_status = api._status
    clock = VirtualClock()
    monkeypatch.setattr(api, "_status", status_then_a_halt_commits)
    monkeypatch.setattr(api, "time", clock)
    answer = agent.get(STATUS, {"since": before["version"], "wait": 20}).json()
    assert [h["scope"] for h in answer["halts"]] == ["tool:stripe.*"]
    assert clock.now - 1_000.0 < 0.5  # woken by the change counter, not by the 1 s re-read


def test_the_long_poll_refuses_a_bad_wait(alice: Person) -> None:
    agent = scoped_key_client(alice.tenant, "gate")
    for wait in ["soon", "nan", "-1"]:
        response = agent.get(STATUS, {"wait": wait})
        assert response.status_code == 400 and response.json()["field"] == "wait", wait


def test_a_third_tenant_sees_and_touches_nothing(alice: Person, carol: Person) -> None:
    owner_a = alice.session_client()
    budget = owner_a.post(
        "/api/v1/fleet/budgets", {"name": "a-only", "max_total": 5, "window_s": 60}, format="json"
    )
    halt = owner_a.post("/api/v1/fleet/halts", {"scope": "*", "reason": "a's incident"}, format="json")
    owner_c = carol.session_client()
    assert owner_c.get("/api/v1/fleet/budgets").json() == []
    assert owner_c.get("/api/v1/fleet/halts").json() == []
    assert owner_c.get(f"/api/v1/fleet/budgets/{budget.json()['id']}").status_code == 404
    assert owner_c.delete(f"/api/v1/fleet/halts/{halt.json()['id']}").status_code == 404
    assert owner_c.delete(f"/api/v1/fleet/budgets/{budget.json()['id']}").status_code == 404
    status_c = scoped_key_client(carol.tenant, "gate").get(STATUS).json()
    assert status_c["halts"] == [] and status_c["governed_tools"] == []
    allowed = (
        scoped_key_client(carol.tenant, "gate").post(EVALUATE, gate_call(1, amount=10), format="json").json()
    )
    assert allowed["decision"] == "allow"  # a's halt and budget do not touch c
    assert [h["reason"] for h in owner_a.get("/api/v1/fleet/halts").json()] == ["a's incident"]
