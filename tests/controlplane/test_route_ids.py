"""Integer ids in paths and numbers in request text (issue 23, item 4).

Every route with an integer id names it with the one converter (`<id:...>`, core/numbers.py:
ASCII digits, at most 18); the route table is walked, so a new route with an integer id spelled
any other way fails here. For every such route and every method it declares, an id spelled with
non-ASCII digits ('²', or the real object's id in Arabic-Indic or fullwidth digits), a huge
number or a signed or padded one is answered 404, as the owner (who may do everything), and
writes nothing.

Before: `fleet/api.py::_pk` checked `str.isdigit()` then called int(): `GET
/api/v1/fleet/budgets/%C2%B2` answered 500, `%D9%A4` returned budget 4 and `DELETE` of it deleted
the budget."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.converters import IntConverter, PathConverter, StringConverter
from sagaplane import cosignature

from approvals import services as approvals
from core.numbers import IdConverter, ascii_int
from fleet import services as fleet
from tenants import founding, services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Role
from tests.support.scoping import in_tenant
from transparency import witnesses

# Path parameters spelled as text on purpose: none of them is an integer id.
TEXT_IDS = {
    "saga_id",  # the agent's own name for a saga
    "stream_id",  # the agent's own name for a stream
    "approval_id",  # a digest (hex)
    "job_id",  # a UUID
    "check_id",  # a UUID
    "token",  # a signed token
    "tile",  # a tile path ("000.p/5")
    "bundle",  # an entry bundle's path
}
_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.I)
_BOOKKEEPING = re.compile(r'"django_session"|^UPDATE "tenants_apikey" SET "last_used_at"')


def _routes(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for item in patterns:
        if isinstance(item, URLResolver):
            if item.namespace == "admin":
                continue  # Django's own admin, for staff only
            yield from _routes(item.url_patterns, prefix + str(item.pattern))
        elif isinstance(item, URLPattern):
            yield prefix + str(item.pattern), item


ROUTES = list(_routes(get_resolver().url_patterns))
ID_ROUTES = [
    (pattern, item)
    for pattern, item in ROUTES
    if any(isinstance(c, IdConverter) for c in getattr(item.pattern, "converters", {}).values())
]


def test_every_integer_path_parameter_is_an_id_and_every_other_is_named_text() -> None:
    assert len(ID_ROUTES) >= 16  # not vacuous: the fleet's, approvals', keys', members' and pages'
    for pattern, item in ROUTES:
        for name, converter in getattr(item.pattern, "converters", {}).items():
            assert not isinstance(converter, IntConverter), f"{pattern}: <int:{name}> is unbounded; use <id:>"
            if isinstance(converter, StringConverter | PathConverter):
                assert name in TEXT_IDS, f"{pattern}: <{name}> as text; an integer id is <id:{name}>"


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("0", 0),
        ("7", 7),
        ("000123", 123),
        ("9" * 18, 10**18 - 1),
        ("9" * 19, None),
        ("", None),
        (" 7", None),
        ("7 ", None),
        ("7\n", None),
        ("+7", None),
        ("-7", None),
        ("1_0", None),
        ("0x1", None),
        ("²", None),  # a digit to str.isdigit(), refused by int()
        ("٤", None),  # Arabic-Indic four: int() reads 4
        ("４", None),  # fullwidth four: int() reads 4
        ("1" * 5000, None),  # past int()'s digit limit: ValueError
    ],
)
def test_ascii_int_takes_ascii_digits_only(text: str, number: int | None) -> None:
    assert ascii_int(text) == number


def _spelled(number: int, zero: str) -> str:
    return "".join(chr(ord(zero) + int(d)) for d in str(number))


@pytest.fixture
def objects(db: None) -> dict[str, Any]:
    acme = founding.create_tenant("acme", "Acme", "owner@acme.example", actor=named_actor("test"))
    spare, _ = in_tenant(
        services.create_api_key, acme, NewApiKey(name="spare", scopes=["read"]), actor=named_actor("test")
    )
    member = in_tenant(
        services.add_member, acme, "viewer@acme.example", Role.VIEWER, actor=named_actor("test")
    )
    owner = in_tenant(services.add_member, acme, "boss@acme.example", Role.OWNER, actor=named_actor("test"))
    return {
        "owner": owner.user,
        "pk": spare.pk,
        "key_id": spare.pk,
        "membership_id": member.pk,
        "budget_id": in_tenant(
            fleet.create_budget,
            acme,
            fleet.BudgetCreate.parse({"name": "b", "max_total": 100, "window_s": 60}),
            actor=named_actor("test"),
        ).pk,
        "rate_limit_id": in_tenant(
            fleet.create_rate_limit,
            acme,
            fleet.RateLimitCreate.parse({"name": "r", "max_calls": 10, "window_s": 60}),
            actor=named_actor("test"),
        ).pk,
        "halt_id": in_tenant(
            fleet.halt,
            acme,
            fleet.HaltCreate.parse({"scope": "tool:x.*", "reason": "ids"}),
            actor=named_actor("test"),
        ).pk,
        "breaker_id": in_tenant(
            fleet.create_breaker,
            acme,
            fleet.BreakerCreate.parse(
                {
                    "name": "b",
                    "tool": "x.*",
                    "consecutive_failures": 5,
                    "failure_rate": 0.5,
                    "min_volume": 20,
                    "window_s": 60,
                    "cool_down_s": 30,
                }
            ),
            actor=named_actor("test"),
        ).pk,
        "policy_id": in_tenant(
            approvals.create_policy,
            acme,
            approvals.PolicyCreate.parse({"name": "p", "tool": "bank.*"}),
            actor=named_actor("test"),
        ).pk,
        "witness_id": in_tenant(
            witnesses.add_witness,
            acme,
            witnesses.WitnessAdd.parse(
                {
                    "name": "w",
                    "url": "http://127.0.0.1:9/",
                    "vkey": cosignature.generate_cosigner("witness.test/ids").verifier.encode(),
                }
            ),
            actor=named_actor("test"),
        ).pk,
        "level": 0,
        "tile": "000.p/1",
    }


def _declared(item: URLPattern) -> list[str]:
    view_class = getattr(item.callback, "view_class", None)
    access = getattr(view_class, "access", None) or getattr(item.callback, "access", None)
    assert access, f"{item.pattern}: declares no access"
    return sorted(access)


def _hostile(real: int) -> list[str]:
    return [
        quote("²"),
        quote(_spelled(real, "٠")),  # the real object's id in Arabic-Indic digits
        quote(_spelled(real, "０")),  # ... and in fullwidth digits
        "9" * 19,  # past a bigint
        "1" * 400,
        "-1",
        "+1",
        "%20" + str(real),
        "1_0",
    ]


@pytest.mark.parametrize(("pattern", "item"), ID_ROUTES, ids=[p for p, _ in ID_ROUTES])
def test_an_id_route_refuses_every_other_spelling_with_404_and_changes_nothing(
    objects: dict[str, Any], pattern: str, item: URLPattern
) -> None:
    client = Client(HTTP_X_SAGAPLANE_TENANT="acme")
    client.force_login(objects["owner"])
    failures = []
    for name in (n for n, c in item.pattern.converters.items() if isinstance(c, IdConverter)):
        for value in _hostile(int(objects[name])):
            path = "/" + pattern
            for param in item.pattern.converters:
                spelled = value if param == name else str(objects[param])
                path = re.sub(rf"<\w+:{param}>", spelled, path)
            for method in _declared(item):
                with transaction.atomic(), CaptureQueriesContext(connection) as queries:
                    response = client.generic(method, path, data="{}", content_type="application/json")
                    transaction.set_rollback(True)
                writes = [
                    q["sql"][:100]
                    for q in queries.captured_queries
                    if _WRITE.match(q["sql"]) and not _BOOKKEEPING.search(q["sql"])
                ]
                if response.status_code != 404 or writes:
                    failures.append(f"{method} {path}: {response.status_code} {writes}")
                elif path.startswith("/api/") and response.json().get("error") != "not_found":
                    failures.append(f"{method} {path}: 404 without the error shape")
    assert failures == []


def test_a_content_length_of_thousands_of_digits_is_a_400(objects: dict[str, Any]) -> None:
    client = Client(HTTP_X_SAGAPLANE_TENANT="acme")
    client.force_login(objects["owner"])
    response = client.post(
        "/api/v1/fleet/budgets", data="{}", content_type="application/json", CONTENT_LENGTH="9" * 5000
    )
    assert response.status_code == 400 and response.json()["field"] == "Content-Length"


def test_a_form_number_spelled_with_another_digit_is_refused_not_a_500(objects: dict[str, Any]) -> None:
    client = Client(HTTP_X_SAGAPLANE_TENANT="acme")
    client.force_login(objects["owner"])
    response = client.post("/evidence/witnesses/quorum", {"quorum": "²"})  # int() raised on it
    assert response.status_code == 302
    followed = client.get(response["Location"])
    assert "Quorum not set" in followed.content.decode()
