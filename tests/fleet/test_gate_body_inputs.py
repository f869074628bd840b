"""The bodies of a reservation's settlement, a lease's return and a quarantine, parsed by typed
inputs (fleet/inputs.py, issue 25 step 5): every refusal keeps its status, code, sentence and
field, and which one wins when several apply (a 404 for a missing reservation or lease wins over
an amount judged with it; the quarantine's `saga_not_found` over the body unless preemptive).
Written against the hand-parsed views first, and passing there."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fleet import services
from fleet.gate import MAX_WHOLE_UNITS, GateRequest
from fleet.stores import DatabaseStore
from tenants.actors import named_actor
from tests.support.chains import ensure_sample
from tests.support.factories import Person
from tests.support.scoping import in_statements, in_tenant

ACTOR = named_actor("test:inputs")
BODY = (400, {"error": "invalid", "detail": "the body must be a JSON object", "field": "body"})


@pytest.fixture(autouse=True)
def database_store() -> Iterator[None]:
    services.set_store(DatabaseStore())
    yield
    services.set_store(None)


def _shape(answer: Any) -> tuple[int, dict[str, Any]]:
    return answer.status_code, answer.json()


def _invalid(field: str, detail: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": "invalid", "detail": detail, "field": field}


def _budget(person: Person) -> None:
    body = {"name": "tokens", "tool": "llm.*", "argument": "max_tokens", "max_total": 100, "window_s": 3600}
    in_tenant(services.create_budget, person.tenant, services.BudgetCreate.parse(body), actor=ACTOR)


# ------------------------------------------------------------------------------------- settlement

NO_RESERVATION = (404, {"error": "not_found", "detail": "no such reservation"})


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ([1], BODY),
        ({}, _invalid("actual", "actual: the amount the call really cost")),
        ({"actual": "ten"}, _invalid("actual", "actual: must be a number")),
        ({"actual": True}, _invalid("actual", "actual: must be a number, not bool")),
        ({"actual": None}, _invalid("actual", "actual: must be a number, not NoneType")),
        ({"actual": [1]}, _invalid("actual", "actual: must be a number, not list")),
        ({"actual": -1}, _invalid("actual", "actual: must not be negative")),
        ({"actual": "NaN"}, _invalid("actual", "actual: must be finite")),
        ({"actual": "1" * 41}, _invalid("actual", "actual: must be a number, not str")),
        ({"actual": 10**12}, _invalid("actual", f"actual: must be at most {MAX_WHOLE_UNITS}")),
        # the amount is judged before the reservation is looked up
        ({"actual": 1}, NO_RESERVATION),
        ({"actual": "0.5", "other": 1}, NO_RESERVATION),
    ],
)
def test_a_settlement_of_an_unknown_reservation_is_judged_body_first(
    alice: Person, body: Any, expected: tuple[int, dict[str, Any]]
) -> None:
    answer = alice.key_client().post(f"/api/v1/gate/reservations/{uuid.uuid4()}/settle", body, format="json")
    assert _shape(answer) == expected


def test_a_reservation_is_settled_at_the_parsed_amount(alice: Person) -> None:
    _budget(alice)
    request = GateRequest(
        saga_id="s", step_id="1", tool="llm.complete", args={}, agent="w", reserve=40 * 10_000
    )
    reserved = in_statements(services.evaluate, alice.tenant, request, actor=ACTOR)
    path = f"/api/v1/gate/reservations/{reserved['authorization_id']}/settle"
    refused = alice.key_client().post(path, {"actual": "x"}, format="json")
    assert _shape(refused) == _invalid("actual", "actual: must be a number")
    settled = alice.key_client().post(path, {"actual": "41.00001"}, format="json")
    assert settled.status_code == 200 and settled.json()["actual"] == "41.0001"  # rounded up to units
    assert settled.json()["overrun"] == "1.0001"
    # settled once: a retry answers the first, whatever its amount
    assert alice.key_client().post(path, {"actual": 0}, format="json").json() == settled.json()


# ------------------------------------------------------------------------------------------ leases

NO_LEASE = (404, {"error": "not_found", "detail": "no such lease"})
NOT_AMOUNTS = _invalid("body.used", "body.used: an object of amounts by limit")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ([1], BODY),
        ({"used": []}, NOT_AMOUNTS),
        ({"used": None}, NOT_AMOUNTS),
        ({"used": "1"}, NOT_AMOUNTS),
        # the amounts are judged with the lease, after it is found
        ({"used": {"nope": 1}}, NO_LEASE),
        ({"used": {"tokens": "x"}}, NO_LEASE),
        ({}, NO_LEASE),
        ({"lease_id": "not-a-uuid"}, NO_LEASE),  # the route's id, not the body's
    ],
)
def test_a_return_of_an_unknown_lease_is_judged_as_before(
    alice: Person, body: Any, expected: tuple[int, dict[str, Any]]
) -> None:
    answer = alice.key_client().post(f"/api/v1/gate/leases/{uuid.uuid4()}/return", body, format="json")
    assert _shape(answer) == expected


def _lease(person: Person) -> str:
    _budget(person)
    body = {"saga_id": "s1", "tool": "llm.complete", "args": {"max_tokens": 1}, "agent": "w"}
    granted = person.key_client().post(
        "/api/v1/gate/leases", {**body, "lease_id": str(uuid.uuid4()), "calls": 4}, format="json"
    )
    assert granted.json()["decision"] == "lease", granted.json()
    return str(granted.json()["lease_id"])


def test_a_lease_judges_the_amounts_used_of_its_own_limits(alice: Person) -> None:
    path = f"/api/v1/gate/leases/{_lease(alice)}/return"
    client = alice.key_client()
    assert _shape(client.post(path, {"used": {"nope": 1}}, format="json")) == _invalid(
        "body.used", "body.used: no limit 'nope' in this lease"
    )
    assert _shape(client.post(path, {"used": {"tokens": "x"}}, format="json")) == _invalid(
        "body.used", "body.used.tokens: must be a number"
    )
    assert _shape(client.post(path, {"used": [1]}, format="json")) == NOT_AMOUNTS
    back = client.post(path, {"used": {"tokens": "2"}}, format="json")
    assert back.status_code == 200 and back.json()["used"] == {"tokens": "2"}
    # given back once: a retry answers the first, its amounts unjudged; its shape still is
    assert client.post(path, {"used": {"nope": "x"}}, format="json").json() == back.json()
    assert client.post(path, {}, format="json").json() == back.json()
    assert _shape(client.post(path, {"used": None}, format="json")) == NOT_AMOUNTS


# -------------------------------------------------------------------------------------- quarantine

UNKNOWN = (
    404,
    {
        "error": "saga_not_found",
        "detail": "no record names this saga yet; send preemptive: true to set it aside before it starts",
        "field": "saga_id",
    },
)
BAD_FLAG = (
    400,
    {"error": "invalid_preemptive", "detail": "preemptive must be true or false", "field": "preemptive"},
)
BAD_REASON = (
    400,
    {"error": "invalid_reason", "detail": "a reason of 1 to 500 characters is required", "field": "reason"},
)
BAD_ID = (
    400,
    {"error": "invalid_saga_id", "detail": "saga_id must be 1 to 128 characters", "field": "saga_id"},
)


@pytest.mark.parametrize(
    ("saga_id", "body", "expected"),
    [
        ("unknown", [1], BODY),
        ("unknown", {}, UNKNOWN),
        ("unknown", {"reason": ""}, UNKNOWN),
        ("unknown", {"reason": "r", "preemptive": False}, UNKNOWN),
        ("unknown", {"reason": 5, "preemptive": False}, UNKNOWN),
        ("unknown", {"reason": "r", "preemptive": "yes"}, BAD_FLAG),
        ("unknown", {"reason": "r", "preemptive": None}, BAD_FLAG),
        ("unknown", {"reason": "", "preemptive": 0}, BAD_FLAG),
        ("unknown", {"preemptive": True}, BAD_REASON),
        ("unknown", {"preemptive": True, "reason": " "}, BAD_REASON),
        ("x" * 129, {"reason": "r", "preemptive": "yes"}, BAD_ID),
        ("x" * 129, [1], BODY),
        ("known", {}, BAD_REASON),
        ("known", {"reason": "", "preemptive": 1}, BAD_FLAG),
        ("known", {"reason": "r" * 501}, BAD_REASON),
    ],
)
def test_a_quarantine_refusal_keeps_its_precedence(
    alice: Person, saga_id: str, body: Any, expected: tuple[int, dict[str, Any]]
) -> None:
    if saga_id == "known":
        saga_id = ensure_sample(alice.tenant).saga_id
    answer = alice.key_client().post(f"/api/v1/sagas/{saga_id}/quarantine", body, format="json")
    assert _shape(answer) == expected


def test_a_quarantine_keeps_its_terms(alice: Person) -> None:
    saga_id = ensure_sample(alice.tenant).saga_id
    client = alice.key_client()
    held = client.post(f"/api/v1/sagas/{saga_id}/quarantine", {"reason": " fraud ", "x": 1}, format="json")
    assert _shape(held) == (
        201,
        {"saga_id": saga_id, "reason": " fraud ", "actor": held.json()["actor"], "preemptive": False},
    )
    ahead = client.post("/api/v1/sagas/later/quarantine", {"reason": "r", "preemptive": True}, format="json")
    assert (ahead.status_code, ahead.json()["preemptive"]) == (201, True)
