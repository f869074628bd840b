"""Budgets and rate limits changed over the API (`PATCH`, issue 29 item 2: what the Fleet page's
Edit does, a client can do): some terms named, the rest kept, old and new values audited through
the console's own action, the gate holding the next call to the new terms; hostile bodies are a
400 naming their field with nothing changed; readers and other tenants change nothing."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from core.scoping import tenant_context
from fleet.models import BudgetLimit, RateLimit
from tenants.models import Tenant
from tests.support.chains import server_stream
from tests.support.factories import Person, scoped_key_client

pytestmark = pytest.mark.usefixtures("database_store")

EVALUATE = "/api/v1/gate/evaluate"
BUDGETS = "/api/v1/fleet/budgets"
RATES = "/api/v1/fleet/rate-limits"
BUDGET = {"name": "card spend", "tool": "stripe.*", "max_total": "100", "window_s": 3600, "per": ["agent"]}
RATE = {"name": "mail pace", "tool": "email.*", "max_calls": 5, "window_s": 60}


def _ids(person: Person) -> tuple[int, int]:
    owner = person.session_client()
    budget = owner.post(BUDGETS, BUDGET, format="json")
    rate = owner.post(RATES, RATE, format="json")
    assert budget.status_code == 201 and rate.status_code == 201, (budget.json(), rate.json())
    return budget.json()["id"], rate.json()["id"]


def _terms(tenant: Tenant) -> tuple[Any, ...]:
    with tenant_context(tenant):
        budget, rate = BudgetLimit.objects.get(), RateLimit.objects.get()
    return (
        budget.name,
        budget.tool,
        budget.max_total,
        budget.window_s,
        list(budget.per),
        budget.on_cap,
        rate.name,
        rate.tool,
        rate.max_calls,
        rate.window_s,
        list(rate.per),
    )


def _call(n: int, tool: str, **args: Any) -> dict[str, Any]:
    return {"saga_id": f"saga-{n}", "step_id": "1", "tool": tool, "args": args, "agent": "bot"}


def test_a_patch_changes_the_named_terms_keeps_the_rest_and_is_audited(alice: Person) -> None:
    budget_id, rate_id = _ids(alice)
    owner = alice.session_client()
    budget = owner.patch(f"{BUDGETS}/{budget_id}", {"max_total": 250, "on_cap": "escalate"}, format="json")
    assert budget.status_code == 200, budget.json()
    assert {k: budget.json()[k] for k in ("name", "tool", "max_total", "window_s", "per", "on_cap")} == {
        "name": "card spend",
        "tool": "stripe.*",
        "max_total": "250",
        "window_s": 3600,
        "per": ["agent"],
        "on_cap": "escalate",
    }
    rate = owner.patch(f"{RATES}/{rate_id}", {"window_s": 120, "per": None}, format="json")
    assert rate.status_code == 200, rate.json()
    assert rate.json() == {"id": rate_id, **RATE, "window_s": 120, "per": []}
    events = [r for r in server_stream(alice.tenant) if r["event"].endswith("_UPDATED")]
    assert [r["event"] for r in events] == ["FLEET_BUDGET_UPDATED", "FLEET_RATE_LIMIT_UPDATED"]
    assert (events[0]["old"]["max_total"], events[0]["new"]["max_total"]) == ("100", "250")
    assert (events[0]["old"]["on_cap"], events[0]["new"]["on_cap"]) == ("deny", "escalate")
    assert (events[1]["old"]["window_s"], events[1]["new"]["window_s"]) == (60, 120)
    assert events[0]["actor"] == "user:alice@acme.example"
    # The same terms again change nothing and record nothing.
    assert owner.patch(f"{BUDGETS}/{budget_id}", {"max_total": "250"}, format="json").status_code == 200
    assert len([r for r in server_stream(alice.tenant) if r["event"].endswith("_UPDATED")]) == 2


def test_the_gate_holds_the_next_call_to_the_new_terms(alice: Person) -> None:
    budget_id, rate_id = _ids(alice)
    agent = scoped_key_client(alice.tenant, "gate")
    control = scoped_key_client(alice.tenant, "control")

    def decision(n: int, amount: int) -> str:
        answer = agent.post(EVALUATE, _call(n, "stripe.charge", amount=amount), format="json").json()
        return str(answer["decision"])

    assert decision(1, 60) == "allow"
    lowered = control.patch(f"{BUDGETS}/{budget_id}", {"max_total": 70}, format="json")
    assert lowered.status_code == 200, lowered.json()
    refused = agent.post(EVALUATE, _call(2, "stripe.charge", amount=20), format="json").json()
    assert (refused["decision"], refused["reason"]) == ("deny", "budget_exceeded")
    assert refused["limit"] == "card spend" and decision(3, 10) == "allow"
    assert control.patch(f"{RATES}/{rate_id}", {"max_calls": 1}, format="json").status_code == 200
    answers = [agent.post(EVALUATE, _call(10 + n, "email.send"), format="json").json() for n in range(2)]
    assert [a["decision"] for a in answers] == ["allow", "deny"]
    assert answers[1]["reason"] == "rate_limited"


@pytest.mark.parametrize(
    ("kind", "body", "field", "error"),
    [
        ("budgets", {"max_totl": 5}, "max_totl", "unknown_field"),
        ("budgets", {"usage": []}, "usage", "unknown_field"),
        ("budgets", {"name": "other name"}, "name", "immutable_field"),
        ("budgets", {"max_total": -5}, "max_total", "invalid_max_total"),
        ("budgets", {"max_total": 0}, "max_total", "invalid_max_total"),
        ("budgets", {"max_total": "NaN"}, "max_total", "invalid_max_total"),
        ("budgets", {"max_total": "1e999"}, "max_total", "invalid_max_total"),
        ("budgets", {"max_total": 1e308}, "max_total", "invalid_max_total"),
        ("budgets", {"max_total": True}, "max_total", "invalid_max_total"),
        ("budgets", {"window_s": "60"}, "window_s", "invalid_window"),
        ("budgets", {"window_s": 0}, "window_s", "invalid_window"),
        ("budgets", {"on_cap": "explode"}, "on_cap", "invalid_on_cap"),
        ("budgets", {"per": ["agent", "agent"]}, "per", "invalid_per"),
        ("budgets", {"tool": None}, "tool", "invalid_tool"),
        ("rate-limits", {"max_calls": 0}, "max_calls", "invalid_max_calls"),
        ("rate-limits", {"max_calls": 10**10}, "max_calls", "invalid_max_calls"),
        ("rate-limits", {"max_calls": 2.5}, "max_calls", "invalid_max_calls"),
        ("rate-limits", {"max_calls": -1}, "max_calls", "invalid_max_calls"),
        ("rate-limits", {"tool": "x" * 500}, "tool", "invalid_tool"),
        ("rate-limits", {"argument": "amount"}, "argument", "unknown_field"),
    ],
)
def test_a_hostile_patch_is_a_400_naming_its_field_and_changes_nothing(
    alice: Person, kind: str, body: dict[str, Any], field: str, error: str
) -> None:
    budget_id, rate_id = _ids(alice)
    before = _terms(alice.tenant)
    pk = budget_id if kind == "budgets" else rate_id
    answer = alice.session_client().patch(f"/api/v1/fleet/{kind}/{pk}", body, format="json")
    assert answer.status_code == 400
    assert {k: answer.json()[k] for k in ("error", "field")} == {"error": error, "field": field}
    assert isinstance(answer.json()["detail"], str)
    assert _terms(alice.tenant) == before


@pytest.mark.parametrize(
    "raw", [b"[1, 2]", b'"max_total"', b'{"max_total": NaN}', b"{", b'{"max_total": Infinity}']
)
def test_a_body_that_is_no_json_object_is_a_400_and_changes_nothing(alice: Person, raw: bytes) -> None:
    budget_id, _ = _ids(alice)
    before = _terms(alice.tenant)
    answer = alice.session_client().generic(
        "PATCH", f"{BUDGETS}/{budget_id}", raw, content_type="application/json"
    )
    assert answer.status_code == 400 and set(answer.json()) >= {"error", "detail"}
    assert _terms(alice.tenant) == before


def test_readers_keys_without_control_and_other_tenants_change_nothing(
    alice: Person, bob: Person, carol: Person
) -> None:
    budget_id, rate_id = _ids(alice)
    before = _terms(alice.tenant)
    change = {"max_total": 1}
    assert bob.session_client().patch(f"{BUDGETS}/{budget_id}", change, format="json").status_code == 403
    gate_key = scoped_key_client(alice.tenant, "gate", "read")
    assert gate_key.patch(f"{RATES}/{rate_id}", {"max_calls": 1}, format="json").status_code == 403
    outsider = carol.session_client()
    for path, body in ((f"{BUDGETS}/{budget_id}", change), (f"{RATES}/{rate_id}", {"max_calls": 1})):
        answer = outsider.patch(path, body, format="json")
        assert answer.status_code == 404 and answer.json()["error"] == "not_found"
    outsider_key = scoped_key_client(carol.tenant, "control")
    assert outsider_key.patch(f"{BUDGETS}/{budget_id}", change, format="json").status_code == 404
    assert _terms(alice.tenant) == before
    with tenant_context(carol.tenant):
        assert not BudgetLimit.objects.exists() and not RateLimit.objects.exists()
    assert Decimal(before[2]) == Decimal(100)
