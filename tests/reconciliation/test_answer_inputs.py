"""An observer's answers as typed inputs (reconciliation/inputs.py): `.../checks/<id>/report` and
`/answers` refuse what they refused before, in the one error shape naming the same field, in the
same order, and record what they recorded before (written against the hand-parsed views first)."""

from __future__ import annotations

from typing import Any

import pytest

from core.scoping import tenant_context
from reconciliation import services
from reconciliation.models import ReconciliationCheck
from tenants.models import Tenant
from tests.support.chains import Writer, compensated_saga
from tests.support.factories import Person
from tests.support.scoping import in_tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_delay")]

ANSWERS = "/api/v1/reconciliation/answers"
NOBODY = "00000000-0000-0000-0000-000000000000"
BODY = (400, "invalid", "the body must be a JSON object", "body")
REQUIRED = (400, "invalid", "reversed: required (true, false or null)", "reversed")
ERROR = (400, "invalid", "error: true or false", "error")
TOKEN = (400, "invalid", "token: the integer the claim returned", "token")
REVERSED = (400, "invalid", "reversed: true, false or null", "reversed")
DETAIL = (400, "invalid", "detail: a string", "detail")
NOT_FOUND = (404, "not_found", "no such reconciliation check", None)
LIST = (400, "invalid", "answers: a list of 1 to 500 answers", "answers")


def _report(check_id: str) -> str:
    return f"/api/v1/reconciliation/checks/{check_id}/report"


def _shape(answer: Any) -> tuple[int, str, str, str | None]:
    body = answer.json()
    return answer.status_code, body["error"], body["detail"], body.get("field")


def _claimed(person: Person, tenant: Tenant, writer: Writer, charges: list[str]) -> list[dict[str, Any]]:
    compensated_saga(writer, "checkout-1", charges=charges)
    in_tenant(services.scan, tenant)
    response = person.key_client().post(
        "/api/v1/reconciliation/claim", {"handlers": ["shop.refund"], "worker": "w"}, format="json"
    )
    assert response.status_code == 200, response.content
    return sorted(response.json()["checks"], key=lambda c: c["kwargs"]["charge_id"])


def _statuses(tenant: Tenant) -> dict[str, str]:
    with tenant_context(tenant):
        return dict(ReconciliationCheck.objects.values_list("kwargs__charge_id", "status"))


def test_a_report_is_refused_by_field_in_the_order_it_was(
    alice: Person, tenant_a: Tenant, agent_a: Writer
) -> None:
    (check,) = _claimed(alice, tenant_a, agent_a, ["ch_1"])
    client, token = alice.key_client(), check["token"]
    ok: dict[str, Any] = {"token": token, "reversed": True}
    cases: list[tuple[Any, tuple[int, str, str, str | None]]] = [
        ([ok], BODY),
        ("not an object", BODY),
        ({"token": token}, REQUIRED),
        ({"token": "x", "error": "yes"}, REQUIRED),  # reversed's presence first
        ({**ok, "error": "yes"}, ERROR),
        ({**ok, "error": None}, ERROR),
        ({**ok, "error": 1, "token": "1"}, ERROR),  # error before the token
        ({"reversed": True}, TOKEN),
        ({**ok, "token": None}, TOKEN),
        ({**ok, "token": "1"}, TOKEN),
        ({**ok, "token": 1.0}, TOKEN),
        ({**ok, "token": True}, TOKEN),
        ({**ok, "token": "1", "reversed": 0}, TOKEN),  # the token before reversed
        ({**ok, "reversed": 0}, REVERSED),
        ({**ok, "reversed": "false"}, REVERSED),
        ({**ok, "reversed": 1, "detail": 5}, REVERSED),  # reversed before the detail
        ({**ok, "detail": {"a": 1}}, DETAIL),
        ({**ok, "detail": 0}, DETAIL),  # strict here: only a string or null
        ({**ok, "detail": False}, DETAIL),
    ]
    for body, expected in cases:
        assert _shape(client.post(_report(check["id"]), body, format="json")) == expected, body
    assert _statuses(tenant_a) == {"ch_1": "claimed"}  # no refusal recorded anything
    # The body is judged before the check is looked up: a well-formed id of no check is a 404
    # only for a well-formed body; a malformed id is a 404 whatever the token.
    assert _shape(client.post(_report(NOBODY), {**ok, "token": "1"}, format="json")) == TOKEN
    assert _shape(client.post(_report(NOBODY), ok, format="json")) == NOT_FOUND
    assert _shape(client.post(_report("not-a-uuid"), ok, format="json")) == NOT_FOUND
    assert _shape(client.post(_report("not-a-uuid"), {**ok, "token": "1"}, format="json")) == NOT_FOUND
    assert _shape(client.post(_report("not-a-uuid"), [ok], format="json")) == NOT_FOUND  # even no object
    answer = client.post(_report(check["id"]), {**ok, "detail": None, "error": False}, format="json")
    assert answer.json() == {"id": check["id"], "status": "confirmed", "reason": "reversed"}


def test_a_report_of_null_with_error_is_an_observer_error(
    alice: Person, tenant_a: Tenant, agent_a: Writer
) -> None:
    (check,) = _claimed(alice, tenant_a, agent_a, ["ch_1"])
    body = {"token": check["token"], "reversed": None, "error": True, "detail": "a\x00b", "other": 1}
    answer = alice.key_client().post(_report(check["id"]), body, format="json")
    assert answer.json() == {"id": check["id"], "status": "unverifiable", "reason": "observer_error"}
    with tenant_context(tenant_a):
        assert (
            ReconciliationCheck.objects.get(pk=check["id"]).detail == "a\ufffdb"
        )  # NUL kept out of Postgres


def test_answers_are_refused_by_item_and_field_in_the_order_they_were(
    alice: Person, tenant_a: Tenant, agent_a: Writer
) -> None:
    (check,) = _claimed(alice, tenant_a, agent_a, ["ch_1"])
    client = alice.key_client()
    ok: dict[str, Any] = {"id": check["id"], "token": check["token"], "reversed": True}

    def item(i: int, field: str, sentence: str) -> tuple[int, str, str, str]:
        return (400, "invalid", sentence, f"answers[{i}]{field}")

    obj = "an object with id, token and reversed"
    cases: list[tuple[Any, tuple[int, str, str, str | None]]] = [
        ([ok], BODY),
        ({}, LIST),
        ({"answers": None}, LIST),
        ({"answers": []}, LIST),
        ({"answers": ok}, LIST),
        ({"answers": [5] * 501}, LIST),  # the count before any item
        ({"answers": [5]}, item(0, "", f"answers[0]: {obj}")),
        ({"answers": [{"id": check["id"], "token": 1}]}, item(0, "", f"answers[0]: {obj}")),
        ({"answers": [{"reversed": True}]}, item(0, ".id", "answers[0].id: a check id the claim returned")),
        ({"answers": [{**ok, "id": 5}]}, item(0, ".id", "answers[0].id: a check id the claim returned")),
        ({"answers": [{**ok, "id": "nope"}]}, item(0, ".id", "answers[0].id: a check id the claim returned")),
        (
            {"answers": [{**ok, "id": "nope", "error": "yes"}]},
            item(0, ".id", "answers[0].id: a check id the claim returned"),
        ),
        ({"answers": [{**ok, "error": "yes"}]}, item(0, ".error", "answers[0].error: true or false")),
        ({"answers": [{**ok, "error": None}]}, item(0, ".error", "answers[0].error: true or false")),
        (
            {"answers": [{**ok, "error": 0, "token": "1"}]},
            item(0, ".error", "answers[0].error: true or false"),
        ),
        ({"answers": [{**ok, "token": "1"}]}, item(0, ".token", "token: the integer the claim returned")),
        ({"answers": [{**ok, "token": None}]}, item(0, ".token", "token: the integer the claim returned")),
        (
            {"answers": [{"id": check["id"], "reversed": 0}]},
            item(0, ".token", "token: the integer the claim returned"),
        ),
        ({"answers": [{**ok, "reversed": 0}]}, item(0, ".reversed", "reversed: true, false or null")),
        (
            {"answers": [{**ok, "reversed": "x", "detail": 5}]},
            item(0, ".reversed", "reversed: true, false or null"),
        ),
        ({"answers": [{**ok, "detail": {"a": 1}}]}, item(0, ".detail", "detail: a string")),
        ({"answers": [{**ok, "detail": 5}, 7]}, item(0, ".detail", "detail: a string")),  # item by item
        ({"answers": [ok, {**ok, "token": 1.5}]}, item(1, ".token", "token: the integer the claim returned")),
        ({"answers": [ok, None]}, item(1, "", f"answers[1]: {obj}")),
    ]
    for body, expected in cases:
        assert _shape(client.post(ANSWERS, body, format="json")) == expected, body
    assert _statuses(tenant_a) == {"ch_1": "claimed"}  # a malformed item refuses the whole request


def test_answers_keep_their_lenient_details_and_the_ids_as_given(
    alice: Person, tenant_a: Tenant, agent_a: Writer
) -> None:
    checks = _claimed(alice, tenant_a, agent_a, ["ch_1", "ch_2", "ch_3", "ch_4"])
    # An empty detail of any type (0, false, [], {}) is no detail here, as it was; the id is
    # answered as it was given (upper case here), a check's id in any form uuid.UUID reads.
    details: list[Any] = [0, False, [], None]
    answers = [
        {"id": c["id"].upper(), "token": c["token"], "reversed": False, "detail": d}
        for c, d in zip(checks, details, strict=True)
    ]
    answers.append({"id": NOBODY.replace("-", ""), "token": 1, "reversed": True})
    response = alice.key_client().post(ANSWERS, {"answers": answers}, format="json")
    assert response.status_code == 200, response.content
    out = response.json()["answers"]
    assert out[:4] == [{"id": c["id"], "status": "drift", "reason": "not_reversed"} for c in checks]
    assert out[4] == {
        "id": NOBODY.replace("-", ""),
        "error": "not_found",
        "detail": "no such reconciliation check",
    }
    assert _statuses(tenant_a) == {f"ch_{n}": "drift" for n in range(1, 5)}
    with tenant_context(tenant_a):
        assert set(ReconciliationCheck.objects.values_list("detail", flat=True)) == {""}
