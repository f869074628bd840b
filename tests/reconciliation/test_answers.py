"""Several observer answers in one request (`POST /api/v1/reconciliation/answers`): each judged as
its own report would be, recorded in one transaction with one server-stream append; a stale or
foreign answer records nothing; a malformed one refuses the request. The pass's own verdicts
(overdue checks) are appended as one batch too."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from core.scoping import tenant_context
from reconciliation import services
from reconciliation.models import ReconciliationCheck
from tenants.models import Role, Tenant
from tests.support.chains import Writer, compensated_saga, server_stream
from tests.support.factories import Person, make_person
from tests.support.scoping import in_tenant

pytestmark = pytest.mark.usefixtures("no_delay")
ANSWERS = "/api/v1/reconciliation/answers"
NOBODY = "00000000-0000-0000-0000-000000000000"


def _claim(person: Person) -> list[dict[str, Any]]:
    response = person.key_client().post(
        "/api/v1/reconciliation/claim", {"handlers": ["shop.refund"], "worker": "batcher"}, format="json"
    )
    assert response.status_code == 200, response.content
    return sorted(response.json()["checks"], key=lambda c: c["kwargs"]["charge_id"])


def test_a_batch_of_answers_is_judged_one_by_one(alice: Person, tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "checkout-1", charges=["ch_1", "ch_2", "ch_3", "ch_4"])
    in_tenant(services.scan, tenant_a)
    c1, c2, c3, c4 = _claim(alice)
    before = len(server_stream(tenant_a))
    response = alice.key_client().post(
        ANSWERS,
        {
            "answers": [
                {"id": c1["id"], "token": c1["token"], "reversed": True, "detail": "in the ledger"},
                {"id": c2["id"], "token": c2["token"], "reversed": False},
                {"id": c3["id"], "token": c3["token"] + 1, "reversed": True},  # not its token
                {"id": c4["id"], "token": c4["token"], "reversed": None, "error": True, "detail": "timeout"},
                {"id": c1["id"], "token": c1["token"], "reversed": False},  # already decided
            ]
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    out = response.json()["answers"]
    assert out[0] == {"id": c1["id"], "status": "confirmed", "reason": "reversed"}
    assert out[1] == {"id": c2["id"], "status": "drift", "reason": "not_reversed"}
    assert out[2]["error"] == "stale_token"
    assert out[3] == {"id": c4["id"], "status": "unverifiable", "reason": "observer_error"}
    assert out[4]["error"] == "already_decided"
    with tenant_context(tenant_a):
        statuses = dict(ReconciliationCheck.objects.values_list("kwargs__charge_id", "status"))
    assert statuses == {"ch_1": "confirmed", "ch_2": "drift", "ch_3": "claimed", "ch_4": "unverifiable"}
    verdicts = [r for r in server_stream(tenant_a)[before:] if r["event"] == services.VERDICT_EVENT]
    assert [(v["check"], v["verdict"], v["observer"]) for v in verdicts] == [
        (c1["id"], "confirmed", "batcher"),
        (c2["id"], "drift", "batcher"),
        (c4["id"], "unverifiable", "batcher"),
    ]


def test_answers_for_another_tenants_checks_record_nothing(
    alice: Person, tenant_a: Tenant, tenant_b: Tenant, agent_a: Writer
) -> None:
    compensated_saga(agent_a, "checkout-1", charges=["ch_1"])
    in_tenant(services.scan, tenant_a)
    (check,) = _claim(alice)
    outsider = make_person(tenant_b, "mallory", Role.OWNER)
    response = outsider.key_client().post(
        ANSWERS, {"answers": [{"id": check["id"], "token": check["token"], "reversed": True}]}, format="json"
    )
    assert response.status_code == 200 and response.json()["answers"][0]["error"] == "not_found"
    with tenant_context(tenant_a):
        assert ReconciliationCheck.objects.get(pk=check["id"]).status == "claimed"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"answers": {}}, "answers"),
        ({"answers": []}, "answers"),
        ({"answers": [{"id": NOBODY, "token": 1, "reversed": True}] * 501}, "answers"),
        ({"answers": [{"id": NOBODY, "token": 1}]}, "answers[0]"),
        ({"answers": [{"id": "x", "token": 1, "reversed": True}]}, "answers[0].id"),
        ({"answers": [{"id": NOBODY, "token": True, "reversed": True}]}, "answers[0].token"),
        ({"answers": [{"id": NOBODY, "token": 1, "reversed": 1}]}, "answers[0].reversed"),
        ({"answers": [{"id": NOBODY, "token": 1, "reversed": None, "detail": 5}]}, "answers[0].detail"),
        ({"answers": [{"id": NOBODY, "token": 1, "reversed": None, "error": "yes"}]}, "answers[0].error"),
    ],
)
def test_hostile_answers_are_refused(alice: Person, body: dict[str, Any], field: str) -> None:
    response = alice.key_client().post(ANSWERS, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field


def test_overdue_checks_are_decided_in_one_batch(tenant_a: Tenant, agent_a: Writer) -> None:
    compensated_saga(agent_a, "checkout-1", charges=["ch_1", "ch_2", "ch_3"])
    in_tenant(services.scan, tenant_a)
    before = len(server_stream(tenant_a))
    assert in_tenant(services.expire_overdue, tenant_a, now=timezone.now() + timedelta(days=1)) == 3
    stream = server_stream(tenant_a)[before:]
    assert [r["event"] for r in stream] == [services.VERDICT_EVENT] * 3
    assert {r["reason"] for r in stream} == {"no_observer"}
    assert len({r["ts"] for r in stream}) == 1  # one append: one server time
