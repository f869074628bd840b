"""GET /api/v1/sagas pages by keyset and filters by EXISTS: the same sagas, in the same order, as
the old join + DISTINCT and OFFSET pages gave; never another tenant's."""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit import services
from core.scoping import tenant_context
from sagas import selectors
from sagas.models import Saga
from tenants import founding
from tenants.actors import named_actor
from tenants.models import Role
from tests.support.chains import chain, saga_records
from tests.support.factories import PASSWORD, Person, make_person
from tests.support.scoping import in_tenant

TOOLS = ["mail.send", "payments.charge", "crm.update"]


def _seed(person: Person, prefix: str, count: int) -> None:
    """`count` sagas: tools rotate, some sagas use two tools (a step each) or one tool twice,
    outcomes rotate; then ties in last activity and one saga with none, to test the order."""
    bodies: list[dict[str, Any]] = []
    outcomes = ["complete", "rolled_back", "partial"]
    for n in range(count):
        saga_id = f"{prefix}{n:03d}"
        records = saga_records(saga_id, tool=TOOLS[n % 3], steps=1 + n % 2, outcome=outcomes[n % 3])
        if n % 4 == 0:  # a second tool in the same saga, as a step of its own
            extra = saga_records(saga_id, tool=TOOLS[(n + 1) % 3], outcome="none")[1:]
            records = records[:1] + extra + records[1:]
        bodies += records
    in_tenant(
        services.ingest,
        person.tenant,
        "s",
        chain(bodies, ts=timezone.now().timestamp() - 3600),
        actor=named_actor("test"),
    )
    with tenant_context(person.tenant):
        ids = list(Saga.objects.order_by("pk").values_list("pk", flat=True))
        moment = timezone.now() - timedelta(minutes=30)
        Saga.objects.filter(pk__in=ids[3:9]).update(last_activity_at=moment)  # ties
        Saga.objects.filter(pk=ids[min(10, len(ids) - 1)]).update(last_activity_at=None)


def _walk(client: Any, params: dict[str, Any], limit: int) -> list[str]:
    """Every saga id of the list, following `next` page by page."""
    seen: list[str] = []
    response = client.get("/api/v1/sagas", {**params, "limit": limit})
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        assert set(body) == {"next", "results"} and len(body["results"]) <= limit
        seen += [s["saga_id"] for s in body["results"]]
        if not body["next"]:
            return seen
        response = client.get(body["next"])


def _old(person: Person, **filters: str) -> list[str]:
    """The old query: a join on steps with DISTINCT, newest first, ties newest id first; sagas
    with no activity time first (Postgres' order for DESC, made explicit for SQLite)."""
    with tenant_context(person.tenant):
        sagas = Saga.objects.all()
        if filters.get("tool"):
            sagas = sagas.filter(steps__tool=filters["tool"]).distinct()
        if filters.get("status"):
            sagas = sagas.filter(status=filters["status"])
        rows = list(sagas.values_list("saga_id", "last_activity_at", "pk"))
    nulls = sorted((r for r in rows if r[1] is None), key=lambda r: -r[2])
    rest = sorted((r for r in rows if r[1] is not None), key=lambda r: (r[1], r[2]), reverse=True)
    return [r[0] for r in nulls + rest]


@pytest.mark.django_db
# The bounded walk fills the page; or the tool's sagas from the index do; or, past IDS_CAP, the
# planner's own plan.
@pytest.mark.parametrize(("walk", "ids_cap"), [(5_000, 20_000), (5, 20_000), (1, 20_000), (1, 2)])
def test_pages_and_filters_equal_the_old_semantics(
    alice: Person, carol: Person, walk: int, ids_cap: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selectors, "WALK", walk)
    monkeypatch.setattr(selectors, "IDS_CAP", ids_cap)
    _seed(alice, "a", 31)
    _seed(carol, "c", 12)
    client = alice.key_client()
    cases: list[dict[str, str]] = [{}, {"status": "completed"}, {"status": "rolled_back"}]
    cases += [{"tool": t} for t in TOOLS] + [{"tool": "nope"}, {"tool": "mail.send", "status": "completed"}]
    for params in cases:
        want = _old(alice, **params)
        for limit in (1, 4, 50):
            assert _walk(client, params, limit) == want, (params, limit)
    everything = _walk(client, {}, 7)
    assert len(everything) == len(set(everything)) == 31 and everything[0] == "a010"  # no activity: first
    # since: the sagas active since a moment, in the same order
    since = (timezone.now() - timedelta(minutes=45)).isoformat()
    with tenant_context(alice.tenant):
        recent = set(Saga.objects.filter(last_activity_at__gte=since).values_list("saga_id", flat=True))
    assert 0 < len(recent) < 31
    assert _walk(client, {"since": since}, 5) == [s for s in everything if s in recent]


@pytest.mark.django_db
def test_a_third_tenant_sees_nothing(alice: Person, carol: Person) -> None:
    _seed(alice, "a", 9)
    _seed(carol, "c", 9)
    third = founding.create_tenant(
        "charlie", "Charlie", "f@charlie.example", PASSWORD, actor=named_actor("test")
    )
    dave = make_person(third, "dave", Role.OWNER)
    client = dave.key_client()
    for params in [{}, {"tool": "mail.send"}, {"status": "completed"}, {"since": "0"}]:
        assert _walk(client, params, 2) == []
    # another tenant's cursor is only a position: it finds nothing of theirs
    first = alice.key_client().get("/api/v1/sagas", {"limit": 2}).json()
    cursor = first["next"].split("cursor=")[1]
    assert client.get("/api/v1/sagas", {"cursor": cursor}).json() == {"next": None, "results": []}
    assert all(s.startswith("c") for s in _walk(carol.key_client(), {"tool": "mail.send"}, 2))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "params, field",
    [
        ({"cursor": "!!!"}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"2026-01-01T00:00:00|abc").decode()}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"2026-01-01T00:00:00|5").decode()}, "cursor"),  # naive
        ({"cursor": base64.urlsafe_b64encode(b"-|99999999999999999999999").decode()}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"\xff\xfe|1").decode()}, "cursor"),
        ({"offset": "50"}, "offset"),
    ],
)
def test_hostile_paging_is_a_400(alice: Person, params: dict[str, str], field: str) -> None:
    response = alice.key_client().get("/api/v1/sagas", params)
    assert response.status_code == 400 and response.json()["field"] == field


@pytest.mark.django_db
def test_limit_is_bounded_and_forgiving(alice: Person) -> None:
    _seed(alice, "a", 6)
    client = alice.key_client()
    assert len(client.get("/api/v1/sagas", {"limit": "nonsense"}).json()["results"]) == 6
    assert len(client.get("/api/v1/sagas", {"limit": "0"}).json()["results"]) == 1
    assert len(client.get("/api/v1/sagas", {"limit": str(10**30)}).json()["results"]) == 6
