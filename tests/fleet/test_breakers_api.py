"""`/api/v1/fleet/breakers` over HTTP: shapes, who may change them, every hostile field refused
by name with nothing changed, the history, the command, and tenants that see nothing of each
other's breakers."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core.scoping import tenant_context
from fleet.models import BreakerTransition, CircuitBreaker
from tenants import founding
from tenants.actors import named_actor
from tenants.models import Role, Tenant
from tests.support.chains import server_stream
from tests.support.factories import Person, make_person, scoped_key_client

BREAKERS = "/api/v1/fleet/breakers"
GOOD: dict[str, Any] = {
    "name": "stripe down",
    "tool": "stripe.*",
    "consecutive_failures": 5,
    "failure_rate": 0.5,
    "min_volume": 20,
    "window_s": 60,
    "cool_down_s": 30,
}


pytestmark = pytest.mark.usefixtures("database_store")


def count(tenant: Tenant) -> tuple[int, int, int]:
    with tenant_context(tenant):
        return CircuitBreaker.objects.count(), BreakerTransition.objects.count(), len(server_stream(tenant))


def test_an_owner_creates_reads_changes_and_deletes_a_breaker(alice: Person) -> None:
    owner = alice.session_client()
    created = owner.post(BREAKERS, GOOD, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert {k: body[k] for k in GOOD} == GOOD
    assert body["state"] == "closed" and body["phase"] == "closed" and body["history"] == []
    listed = owner.get(BREAKERS).json()
    assert [b["name"] for b in listed] == ["stripe down"]
    detail = f"{BREAKERS}/{body['id']}"
    changed = owner.patch(detail, {"failure_rate": 0.25, "cool_down_s": 120}, format="json")
    assert changed.status_code == 200 and changed.json()["failure_rate"] == 0.25
    assert owner.get(detail).json()["cool_down_s"] == 120
    assert owner.delete(detail).status_code == 204
    assert owner.get(detail).status_code == 404
    events = [r for r in server_stream(alice.tenant) if r["event"].startswith("FLEET_BREAKER")]
    assert [r["event"] for r in events] == [
        "FLEET_BREAKER_CREATED",
        "FLEET_BREAKER_UPDATED",
        "FLEET_BREAKER_DELETED",
    ]
    assert events[0]["old"] is None and events[0]["new"]["tool"] == "stripe.*"
    assert events[1]["old"]["failure_rate"] == 0.5 and events[1]["new"]["failure_rate"] == 0.25
    assert events[2]["old"]["name"] == "stripe down" and events[2]["new"] is None
    assert all(r["actor"].startswith("user:") for r in events)


def test_readers_read_and_only_owners_admins_and_control_keys_change(alice: Person, tenant_a: Tenant) -> None:
    viewer = make_person(tenant_a, "vic", Role.VIEWER).session_client()
    approver = make_person(tenant_a, "apu", Role.APPROVER).session_client()
    admin = make_person(tenant_a, "ada", Role.ADMIN).session_client()
    assert viewer.post(BREAKERS, GOOD, format="json").status_code == 403
    assert approver.post(BREAKERS, GOOD, format="json").status_code == 403
    assert scoped_key_client(tenant_a, "gate").post(BREAKERS, GOOD, format="json").status_code == 403
    made = admin.post(BREAKERS, GOOD, format="json").json()
    assert viewer.get(f"{BREAKERS}/{made['id']}").status_code == 200
    assert viewer.patch(f"{BREAKERS}/{made['id']}", {"min_volume": 1}, format="json").status_code == 403
    assert approver.delete(f"{BREAKERS}/{made['id']}").status_code == 403
    control = scoped_key_client(tenant_a, "control")
    assert control.patch(f"{BREAKERS}/{made['id']}", {"min_volume": 1}, format="json").status_code == 200
    assert control.delete(f"{BREAKERS}/{made['id']}").status_code == 204


HOSTILE: list[tuple[str, Any]] = [
    ("name", ""),
    ("name", "   "),
    ("name", "x" * 101),
    ("name", "a\x00b"),
    ("name", 7),
    ("tool", ""),
    ("tool", "t" * 201),
    ("tool", ["stripe.*"]),
    ("tool", "a\x00"),
    ("consecutive_failures", 0),
    ("consecutive_failures", -1),
    ("consecutive_failures", 10**6 + 1),
    ("consecutive_failures", True),
    ("consecutive_failures", 2.5),
    ("consecutive_failures", "5"),
    ("consecutive_failures", None),
    ("failure_rate", 0),
    ("failure_rate", -0.5),
    ("failure_rate", 1.5),
    ("failure_rate", 0.12345),
    ("failure_rate", "0.5x"),
    ("failure_rate", "\u0660.\u0665"),
    ("failure_rate", True),
    ("failure_rate", 1e308),
    ("failure_rate", None),
    ("min_volume", 0),
    ("min_volume", 10**9 + 1),
    ("min_volume", 10**40),
    ("window_s", 0),
    ("window_s", 366 * 24 * 3600 + 1),
    ("window_s", False),
    ("cool_down_s", 0),
    ("cool_down_s", -5),
    ("cool_down_s", "30"),
    ("cool_down_s", {"s": 30}),
]


@pytest.mark.parametrize(("field", "value"), HOSTILE)
def test_a_hostile_field_is_refused_by_name_and_changes_nothing(
    alice: Person, field: str, value: Any
) -> None:
    owner = alice.session_client()
    existing = owner.post(BREAKERS, {**GOOD, "name": "existing"}, format="json").json()
    before = count(alice.tenant)
    created = owner.post(BREAKERS, {**GOOD, field: value}, format="json")
    assert created.status_code == 400, created.json()
    assert created.json()["field"] == field and created.json()["error"]
    changed = owner.patch(f"{BREAKERS}/{existing['id']}", {field: value}, format="json")
    assert changed.status_code == 400 and changed.json()["field"] == field
    assert count(alice.tenant) == before
    assert owner.get(f"{BREAKERS}/{existing['id']}").json()["name"] == "existing"


@pytest.mark.parametrize("missing", list(GOOD))
def test_every_field_is_required_on_creation(alice: Person, missing: str) -> None:
    body = {k: v for k, v in GOOD.items() if k != missing}
    answer = alice.session_client().post(BREAKERS, body, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == missing


@pytest.mark.parametrize("body", [[GOOD], "breaker", 5])
def test_a_body_that_is_not_an_object_is_refused(alice: Person, body: Any) -> None:
    answer = alice.session_client().post(BREAKERS, body, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == "body"


def test_a_name_taken_is_409_on_creation_and_renaming(alice: Person) -> None:
    owner = alice.session_client()
    owner.post(BREAKERS, GOOD, format="json")
    other = owner.post(BREAKERS, {**GOOD, "name": "other"}, format="json").json()
    before = count(alice.tenant)
    assert owner.post(BREAKERS, GOOD, format="json").status_code == 409
    renamed = owner.patch(f"{BREAKERS}/{other['id']}", {"name": "stripe down"}, format="json")
    assert renamed.status_code == 409 and renamed.json()["field"] == "name"
    assert count(alice.tenant) == before


def test_a_third_tenant_sees_and_touches_nothing_of_two_tenants_breakers(
    alice: Person, carol: Person, db: None
) -> None:
    a = alice.session_client().post(BREAKERS, {**GOOD, "name": "a-only"}, format="json").json()
    b = carol.session_client().post(BREAKERS, {**GOOD, "name": "b-only"}, format="json").json()
    third = founding.create_tenant("charlie", "Charlie", "founder@charlie.example", actor=named_actor("test"))
    dave = make_person(third, "dave", Role.OWNER).session_client()
    assert dave.get(BREAKERS).json() == []
    for made in (a, b):
        detail = f"{BREAKERS}/{made['id']}"
        assert dave.get(detail).status_code == 404
        assert dave.patch(detail, {"min_volume": 1}, format="json").status_code == 404
        assert dave.delete(detail).status_code == 404
    assert scoped_key_client(third, "gate").get("/api/v1/fleet/status").json()["breakers"] == []
    assert [x["name"] for x in alice.session_client().get(BREAKERS).json()] == ["a-only"]
    assert [x["name"] for x in carol.session_client().get(BREAKERS).json()] == ["b-only"]
    assert alice.session_client().get(f"{BREAKERS}/{b['id']}").status_code == 404


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_the_command_creates_lists_and_deletes_as_the_operator(tenant_a: Tenant) -> None:
    out = run(
        "breaker",
        "--tenant",
        "acme",
        "create",
        "--name",
        "stripe down",
        "--tool",
        "stripe.*",
        "--consecutive-failures",
        "5",
        "--failure-rate",
        "0.5",
        "--min-volume",
        "20",
        "--window",
        "60",
        "--cool-down",
        "30",
    )
    assert "breaker stripe down on stripe.* created for acme" in out
    assert "stripe down\tstripe.*\tclosed" in run("breaker", "--tenant", "acme", "list")
    created = server_stream(tenant_a)[-1]
    assert created["event"] == "FLEET_BREAKER_CREATED" and created["actor"].startswith("cli:")
    with pytest.raises(CommandError, match="failure_rate"):
        run(
            *[
                "breaker",
                "--tenant",
                "acme",
                "create",
                "--name",
                "x",
                "--tool",
                "y",
                "--consecutive-failures",
                "1",
            ],
            *["--failure-rate", "2", "--min-volume", "1", "--window", "1", "--cool-down", "1"],
        )
    with pytest.raises(CommandError, match="name: no breaker"):
        run("breaker", "--tenant", "acme", "delete", "--name", "nope")
    assert "deleted" in run("breaker", "--tenant", "acme", "delete", "--name", "stripe down")
    assert run("breaker", "--tenant", "acme", "list") == ""
