"""Budgets and rate limits edited from their forms (issue 29, item 2), without a browser: the form
comes back with the limit's terms in its units, a save sets them through the same typed input as
a creation (its name stays) and records old and new values, hostile values are refused beside
their field with nothing changed, readers and other tenants change nothing."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from core.scoping import tenant_context
from fleet.models import BudgetLimit, RateLimit
from tests.support.chains import server_stream
from tests.support.factories import Person

pytestmark = pytest.mark.django_db

BUDGET = {"name": "card spend", "tool": "stripe.*", "argument": "amount", "max_total": "50,000"}
BUDGET_FORM = {**BUDGET, "window": "1", "window_unit": "d", "on_cap": "deny"}
RATE_FORM = {"name": "mail pace", "tool": "email.*", "max_calls": "60", "window": "1", "window_unit": "min"}


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def _ids(person: Person) -> tuple[int, int]:
    owner = browser(person)
    assert owner.post("/fleet/budgets", BUDGET_FORM).status_code == 302
    assert owner.post("/fleet/rate-limits", RATE_FORM).status_code == 302
    with tenant_context(person.tenant):
        return BudgetLimit.objects.get().pk, RateLimit.objects.get().pk


def test_a_budget_and_a_rate_limit_are_edited_from_their_forms(alice: Person) -> None:
    budget_id, rate_id = _ids(alice)
    owner = browser(alice)
    form = owner.get(f"/fleet/budgets/{budget_id}/edit").content.decode()
    assert 'value="50000"' in form and 'value="stripe.*"' in form and "card spend" in form
    assert '<option value="d" selected>' in form
    saved = owner.post(
        f"/fleet/budgets/{budget_id}/edit",
        {
            **BUDGET_FORM,
            "name": "renamed",
            "max_total": "75000",
            "window": "12",
            "window_unit": "h",
            "per": ["agent"],
        },
    )
    assert saved.status_code == 302
    with tenant_context(alice.tenant):
        limit = BudgetLimit.objects.get()
    assert (limit.name, limit.max_total, limit.window_s, limit.per) == (
        "card spend",
        Decimal(75000),
        43200,
        ["agent"],
    )
    rate_form = owner.get(f"/fleet/rate-limits/{rate_id}/edit").content.decode()
    assert 'value="60"' in rate_form and '<option value="min" selected>' in rate_form
    assert (
        owner.post(f"/fleet/rate-limits/{rate_id}/edit", {**RATE_FORM, "max_calls": "30"}).status_code == 302
    )
    with tenant_context(alice.tenant):
        assert RateLimit.objects.get().max_calls == 30
    events = [r for r in server_stream(alice.tenant) if r["event"].endswith("_UPDATED")]
    assert [r["event"] for r in events] == ["FLEET_BUDGET_UPDATED", "FLEET_RATE_LIMIT_UPDATED"]
    assert events[0]["old"]["max_total"] == "50000" and events[0]["new"]["max_total"] == "75000"
    assert events[1]["old"]["max_calls"] == 60 and events[1]["new"]["max_calls"] == 30
    page = owner.get("/fleet/").content.decode()
    assert "Edit budget card spend" in page and "Edit rate limit mail pace" in page


@pytest.mark.parametrize(
    ("path", "hostile", "field"),
    [
        ("budgets", {"max_total": "-5"}, "max_total"),
        ("budgets", {"max_total": "1e999999"}, "max_total"),
        ("budgets", {"window": "x" * 5000}, "window"),
        ("budgets", {"window_unit": "fortnight"}, "window"),
        ("budgets", {"on_cap": "explode"}, "on_cap"),
        ("budgets", {"per_args": "a, b, c, d, e"}, "per"),
        ("rate-limits", {"max_calls": "0"}, "max_calls"),
        ("rate-limits", {"max_calls": "٣"}, "max_calls"),
        ("rate-limits", {"tool": "x" * 500}, "tool"),
    ],
)
def test_hostile_edits_are_refused_beside_their_field(
    alice: Person, path: str, hostile: dict[str, Any], field: str
) -> None:
    budget_id, rate_id = _ids(alice)
    pk, form = (budget_id, BUDGET_FORM) if path == "budgets" else (rate_id, RATE_FORM)
    answer = browser(alice).post(f"/fleet/{path}/{pk}/edit", {**form, **hostile})
    assert 400 <= answer.status_code < 500 and b'role="alert"' in answer.content
    with tenant_context(alice.tenant):
        assert BudgetLimit.objects.get().max_total == Decimal(50000)
        assert RateLimit.objects.get().max_calls == 60


def test_readers_and_other_tenants_edit_nothing(alice: Person, bob: Person, carol: Person) -> None:
    budget_id, rate_id = _ids(alice)
    assert browser(bob).get(f"/fleet/budgets/{budget_id}/edit").status_code == 403
    assert browser(bob).post(f"/fleet/rate-limits/{rate_id}/edit", RATE_FORM).status_code == 403
    assert browser(carol).get(f"/fleet/budgets/{budget_id}/edit").status_code == 404
    assert (
        browser(carol).post(f"/fleet/rate-limits/{rate_id}/edit", {**RATE_FORM, "max_calls": "1"}).status_code
        == 404
    )
    with tenant_context(alice.tenant):
        assert RateLimit.objects.get().max_calls == 60
