"""The approval policy's rule builder without a browser (issue 29, item 2): rows become the API's
predicates and escalation (the same typed input judges them), an Edit makes the next version,
the history shows who changed what as text, the preview counts the last day's matching calls of
this tenant only, and hostile rows are refused beside the form, never a 5xx."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalPolicy, PolicyVersion
from core.scoping import tenant_context
from frontend import policy_builder as builder
from tenants.models import Tenant
from tests.support.factories import Person
from tests.support.sagadata import Writer, saga_forward

pytestmark = pytest.mark.django_db

FORM = {
    "name": "big charges",
    "tool": "charge_*",
    "required_approvals": "1",
    "eligible_roles": ["owner", "admin"],
    "ttl_minutes": "90",
    "execution_window_minutes": "5",
    "warn_before_minutes": "5",
    "conditions": "2",
    "c0_arg": "amount",
    "c0_op": ">=",
    "c0_value": "40",
    "c1_arg": "order",
    "c1_op": "in",
    "c1_value": "A-17, B-2",
    "c1_join": "or",
    "levels": "1",
    "e0_after": "30",
    "e0_roles": ["owner"],
}


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def ship(person: Person, records: list[dict[str, Any]]) -> None:
    response = person.key_client().post(
        "/api/v1/streams/agent-1/records", {"records": records}, format="json"
    )
    assert response.status_code == 200, response.content


def test_rows_read_back_as_the_predicates_they_make() -> None:
    rows = builder.Builder(
        conditions=[
            {"arg": "amount", "op": ">", "value": "10,000", "join": "and"},
            {"arg": "to", "op": "domain_not_in", "value": "example.com, corp.example", "join": "and"},
            {"arg": "currency", "op": "==", "value": "USD", "join": "or"},
            {"arg": "", "op": ">", "value": "", "join": "and"},
        ]
    )
    predicates = builder.predicates_of(rows)
    assert predicates == [
        {"arg": "amount", "op": ">", "value": 10000},
        {
            "any": [
                {"arg": "to", "op": "domain_not_in", "value": ["example.com", "corp.example"]},
                {"arg": "currency", "op": "==", "value": "USD"},
            ]
        },
    ]
    again = builder.stored(predicates, [], {})
    assert builder.predicates_of(again) == predicates and again.kept is None
    nested = [{"any": [{"any": [{"arg": "a", "op": "==", "value": 1}]}]}]
    assert builder.stored(nested, [], {}).kept == nested
    assert builder.sentence(predicates) == (
        "amount is more than 10000 and "
        "(to has a domain outside example.com, corp.example or currency equals USD)"
    )


def test_a_policy_built_edited_and_its_history(alice: Person, tenant_a: Tenant) -> None:
    owner = browser(alice)
    added = owner.post("/approvals/policies/create", {**FORM, "builder": "add-condition"})
    assert added.status_code == 200 and b'id="c2-arg"' in added.content  # a third, blank row
    removed = owner.post("/approvals/policies/create", {**FORM, "builder": "remove-condition-0"})
    assert removed.status_code == 200 and b'value="A-17, B-2"' in removed.content
    assert b'value="40"' not in removed.content
    with tenant_context(tenant_a):
        assert not ApprovalPolicy.objects.exists()  # building saves nothing

    assert owner.post("/approvals/policies/create", FORM).status_code == 302
    with tenant_context(tenant_a):
        policy = ApprovalPolicy.objects.get()
    assert policy.predicates == [
        {
            "any": [
                {"arg": "amount", "op": ">=", "value": 40},
                {"arg": "order", "op": "in", "value": ["A-17", "B-2"]},
            ]
        }
    ]
    assert (policy.ttl_s, policy.escalation[0]["after_s"]) == (5400, 1800)
    listing = owner.get("/approvals/policies/").content.decode()
    assert "decide in 90 min" in listing and "amount is at least 40" in listing and '"op"' not in listing

    form = owner.get(f"/approvals/policies/{policy.pk}/edit").content.decode()
    assert (
        'value="amount"' in form
        and 'value="90"' in form
        and 'id="e0-after" name="e0_after" value="30"' in form
    )
    edited = owner.post(
        f"/approvals/policies/{policy.pk}/edit",
        {**FORM, "conditions": "1", "c0_value": "100", "required_approvals": "2", "ttl_minutes": "120"},
    )
    assert edited.status_code == 302 and edited["Location"].endswith(
        f"/approvals/policies/{policy.pk}/history"
    )
    history = owner.get(f"/approvals/policies/{policy.pk}/history").content.decode()
    assert "Version 2" in history and "Version 1" in history and "user:alice@acme.example" in history
    assert "amount is more than 40" not in history  # the operator kept: at least
    assert "amount is at least 100" in history and "120 min" in history and "90 min" in history
    with tenant_context(tenant_a):
        assert list(PolicyVersion.objects.order_by("version").values_list("version", flat=True)) == [1, 2]


def test_the_preview_counts_this_tenants_calls_of_the_last_day(
    alice: Person, carol: Person, tenant_a: Tenant
) -> None:
    writer = Writer()
    records: list[dict[str, Any]] = []
    for _ in range(3):
        records += saga_forward(writer)[1]  # charge_card 42, reserve_stock 84
    ship(alice, records)
    preview = browser(alice).post(
        "/approvals/policies/create",
        {**FORM, "conditions": "1", "c0_op": ">", "c0_value": "40", "tool": "*", "builder": "preview"},
    )
    page = preview.content.decode()
    assert preview.status_code == 200 and "Would match: 6 of 6 calls" in page
    narrow = browser(alice).post(
        "/approvals/policies/create", {**FORM, "conditions": "1", "c0_value": "50", "builder": "preview"}
    )
    assert "Would match: 0 of 6 calls" in narrow.content.decode()
    other = browser(carol).post("/approvals/policies/create", {**FORM, "tool": "*", "builder": "preview"})
    assert "Would match: 0 of 0 calls" in other.content.decode()  # another tenant's calls: none


@pytest.mark.parametrize(
    "hostile",
    [
        {"c0_value": "x" * 5000},
        {"c0_op": "eval"},
        {"c0_arg": "\x00"},
        {"conditions": "999999999999"},
        {"c0_op": "in", "c0_value": ",".join(["a"] * 300)},
        {"e0_after": "-1"},
        {"e0_after": "99999999999999"},
        {"e0_roles": ["root"]},
        {"e0_members": "nobody@nowhere.example"},
        {"ttl_minutes": "٣"},
        {"builder": "remove-condition-99999"},
        {"builder": "remove-level-x"},
        {"e0_after": "90"},
    ],
)
def test_hostile_rows_are_refused_beside_the_form(
    alice: Person, tenant_a: Tenant, hostile: dict[str, Any]
) -> None:
    owner = browser(alice)
    for builder_action in ("", "preview"):
        answer = owner.post("/approvals/policies/create", {**FORM, "builder": builder_action, **hostile})
        assert answer.status_code in (200, 302, 400), answer.status_code  # never a 5xx
    with tenant_context(tenant_a):
        assert ApprovalPolicy.objects.filter(name="big charges").count() <= 1


def test_escalation_is_asked_and_refused_in_minutes(alice: Person) -> None:
    late = browser(alice).post("/approvals/policies/create", {**FORM, "e0_after": "90"})
    assert late.status_code == 400
    assert b"escalation level 1: after 1 to 89 minutes" in late.content and b"90 min" in late.content


def test_readers_see_the_history_but_cannot_edit(alice: Person, bob: Person, tenant_a: Tenant) -> None:
    assert browser(alice).post("/approvals/policies/create", FORM).status_code == 302
    with tenant_context(tenant_a):
        policy = ApprovalPolicy.objects.get()
    viewer = browser(bob)
    assert viewer.get(f"/approvals/policies/{policy.pk}/history").status_code == 200
    assert viewer.get(f"/approvals/policies/{policy.pk}/edit").status_code == 403
    assert viewer.post(f"/approvals/policies/{policy.pk}/edit", FORM).status_code == 403
