"""The Fleet page's gate controls without a browser: gauges (used / cap), recent denials, the
kill-switch panel, and the forms — by role, with hostile input, and across tenants."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import BudgetLimit, GateDecision, Halt, RateLimit
from tenants.actors import named_actor, user_actor
from tenants.models import Role, Tenant
from tests.support.chains import server_stream
from tests.support.factories import Person, make_person
from tests.support.scoping import in_statements, in_tenant

pytestmark = pytest.mark.usefixtures("database_store")


def browser(person: Person) -> Client:
    client = Client()
    client.force_login(person.user)
    return client


def ask(tenant: Tenant, n: int, tool: str = "stripe.charge", **args: Any) -> dict[str, Any]:
    call = GateRequest(saga_id=f"saga-{n}", step_id="1", tool=tool, args=args, agent="billing-bot")
    return in_statements(services.evaluate, tenant, call, actor=named_actor("test"))


def counts(tenant: Tenant) -> tuple[int, int, int, int, int]:
    with tenant_context(tenant):
        return (
            BudgetLimit.objects.count(),
            RateLimit.objects.count(),
            Halt.objects.count(),
            Halt.objects.filter(lifted_at__isnull=False).count(),
            len(server_stream(tenant)),
        )


def gauge(body: str, budget: str) -> dict[str, str]:
    block = body.split(f'data-budget="{budget}"', 1)[1].split('class="limit"', 1)[0]
    found = re.search(
        r'class="gauge [^"]*" data-scope="([^"]*)" data-used="([^"]*)" data-cap="([^"]*)"', block
    )
    assert found, block
    text = re.search(r'<span class="gauge-text">([^<]*)<', block)
    assert text
    return {"scope": found[1], "used": found[2], "cap": found[3], "text": text[1].strip()}


DAILY_STRIPE = {
    "name": "daily stripe",
    "tool": "stripe.*",
    "argument": "amount",
    "max_total": "50,000",
    "window": "1",
    "window_unit": "d",
}


def test_gauges_show_used_over_cap_and_denials_their_reason(alice: Person) -> None:
    owner = browser(alice)
    created = owner.post(reverse("fleet-budget-create"), DAILY_STRIPE)
    assert created.status_code == 302, created.content.decode()[:2000]
    with tenant_context(alice.tenant):
        limit = BudgetLimit.objects.get()
    assert (limit.tool, limit.argument, int(limit.max_total), limit.window_s) == (
        "stripe.*",
        "amount",
        50_000,
        86_400,
    )
    empty = owner.get(reverse("fleet")).content.decode()
    assert gauge(empty, "daily stripe") == {
        "scope": "fleet",
        "used": "0",
        "cap": "50000",
        "text": "0 / 50,000",
    }
    assert [ask(alice.tenant, n, amount=20_000)["decision"] for n in range(3)] == ["allow", "allow", "deny"]
    for url in (reverse("fleet"), reverse("fleet-controls")):
        body = owner.get(url).content.decode()
        assert gauge(body, "daily stripe") == {
            "scope": "fleet",
            "used": "40000",
            "cap": "50000",
            "text": "40,000 / 50,000",
        }
        denial = re.search(
            r'<tr data-reason="budget_exceeded" data-tool="stripe.charge" data-source="server">.*?</tr>',
            body,
            re.S,
        )
        assert denial and "budget &#x27;daily stripe&#x27; (fleet): 20,000 asked, 10,000 left" in denial[0]
    fragment = owner.get(reverse("fleet-controls")).content.decode()
    assert "<html" not in fragment and 'id="fleet-chart"' not in fragment


def test_a_viewer_sees_everything_but_no_form_and_a_viewers_post_is_403(alice: Person, bob: Person) -> None:
    budget = in_tenant(
        services.create_budget,
        alice.tenant,
        services.BudgetCreate.parse({"name": "spend", "max_total": 100, "window_s": 60}),
        actor=named_actor("test"),
    )
    rate = in_tenant(
        services.create_rate_limit,
        alice.tenant,
        services.RateLimitCreate.parse({"name": "pace", "max_calls": 5, "window_s": 60}),
        actor=named_actor("test"),
    )
    halt = in_tenant(
        services.halt,
        alice.tenant,
        services.HaltCreate.parse({"scope": "tool:email.*", "reason": "bounce storm"}),
        actor=user_actor("alice"),
    )
    viewer = browser(bob)
    body = viewer.get(reverse("fleet")).content.decode()
    for seen in (
        'data-budget="spend"',
        'data-rate-limit="pace"',
        'data-halt-scope="tool:email.*"',
        "bounce storm",
    ):
        assert seen in body
    assert "/fleet/" not in "".join(re.findall(r'<form[^>]*action="([^"]*)"', body))
    assert "<form" not in viewer.get(reverse("fleet-controls")).content.decode()
    before = counts(alice.tenant)
    posts = {
        reverse("fleet-budget-create"): DAILY_STRIPE,
        reverse("fleet-rate-limit-create"): {"name": "x", "tool": "*", "max_calls": "1", "window": "1"},
        reverse("fleet-halt-create"): {"scope_kind": "*", "reason": "viewer says stop"},
        reverse("fleet-budget-delete", args=[budget.pk]): {},
        reverse("fleet-rate-limit-delete", args=[rate.pk]): {},
        reverse("fleet-halt-resume", args=[halt.pk]): {},
    }
    for url, data in posts.items():
        response = viewer.post(url, data)
        assert response.status_code == 403, url
        assert 'id="forbidden"' in response.content.decode()
    assert counts(alice.tenant) == before
    # Owners see every form.
    owner_body = browser(alice).get(reverse("fleet")).content.decode()
    actions = re.findall(r'<form[^>]*action="([^"]*)"', owner_body)
    assert set(posts) <= set(actions)


def test_an_approver_can_halt_and_resume_but_not_change_budgets(alice: Person) -> None:
    rita = make_person(alice.tenant, "rita", Role.APPROVER)
    approver = browser(rita)
    body = approver.get(reverse("fleet")).content.decode()
    assert 'id="halt-form"' in body and 'id="budget-form"' not in body and 'id="rate-form"' not in body
    response = approver.post(
        reverse("fleet-halt-create"),
        {
            "scope_kind": "tool",
            "scope_value": "email.*",
            "mode": "halt",
            "reason": "bounce storm",
            "ttl": "30",
            "ttl_unit": "min",
        },
    )
    assert response.status_code == 302
    with tenant_context(alice.tenant):
        halt = Halt.objects.get()
    assert (halt.scope, halt.mode, halt.actor) == ("tool:email.*", "halt", f"user:{rita.user.get_username()}")
    assert round((halt.expires_at - halt.created_at).total_seconds()) == 1800
    assert ask(alice.tenant, 1, tool="email.send")["reason"] == "halted"
    assert ask(alice.tenant, 2, tool="crm.insert")["decision"] == "allow"
    panel = approver.get(reverse("fleet-controls")).content.decode()
    item = re.search(r'<li class="halt halt-halt" data-halt-scope="tool:email.\*".*?</li>', panel, re.S)
    assert item, panel
    assert "bounce storm" in item[0] and f"user:{rita.user.get_username()}" in item[0]
    assert re.search(r'<dd class="ttl">(29|30)\s+minutes', item[0]), item[0]
    assert reverse("fleet-halt-resume", args=[halt.pk]) in item[0]
    assert approver.post(reverse("fleet-budget-create"), DAILY_STRIPE).status_code == 403
    assert approver.post(reverse("fleet-halt-resume", args=[halt.pk])).status_code == 302
    assert ask(alice.tenant, 3, tool="email.send")["decision"] == "allow"
    assert 'id="no-halts"' in approver.get(reverse("fleet-controls")).content.decode()
    events = [r["event"] for r in server_stream(alice.tenant)]
    assert events[-2:] == ["KILLSWITCH_ENGAGED", "KILLSWITCH_RELEASED"]


GOOD_HALT = {
    "scope_kind": "tool",
    "scope_value": "email.*",
    "mode": "halt",
    "reason": "why",
    "ttl": "",
    "ttl_unit": "min",
}


@pytest.mark.parametrize(
    "change, error_id",
    [
        ({"ttl": "abc"}, "h-ttl-error"),
        ({"ttl": "-5"}, "h-ttl-error"),
        ({"ttl": "0"}, "h-ttl-error"),
        ({"ttl": "1.5"}, "h-ttl-error"),
        ({"ttl": "9" * 30}, "h-ttl-error"),
        ({"ttl": "9" * 5000}, "h-ttl-error"),
        ({"ttl": "400", "ttl_unit": "d"}, "h-ttl-error"),
        ({"ttl": "5", "ttl_unit": "fortnights"}, "h-ttl-error"),
        ({"scope_value": ""}, "h-scope-error"),
        ({"scope_kind": "bogus"}, "h-scope-error"),
        ({"scope_kind": ""}, "h-scope-error"),
        ({"scope_value": "x" * 300}, "h-scope-error"),
        ({"scope_value": "a\x00b"}, None),  # NUL anywhere: the site's own 400, before any view
        ({"reason": "  "}, "h-reason-error"),
        ({"reason": "r" * 501}, "h-reason-error"),
        ({"mode": "explode"}, "h-mode-error"),
    ],
)
def test_a_bad_halt_shows_its_error_beside_the_field_and_creates_nothing(
    alice: Person, change: dict[str, str], error_id: str | None
) -> None:
    before = counts(alice.tenant)
    response = browser(alice).post(reverse("fleet-halt-create"), {**GOOD_HALT, **change})
    assert response.status_code == 400
    assert counts(alice.tenant) == before
    if error_id is None:
        return
    body = response.content.decode()
    assert re.search(rf'<p class="error" id="{error_id}" role="alert">[^<]+</p>', body), body[-3000:]
    assert 'id="halt-form"' in body and "<h1>Fleet</h1>" in body
    assert counts(alice.tenant) == before


@pytest.mark.parametrize(
    "change, error_id",
    [
        ({"max_total": "NaN"}, "b-max-total-error"),
        ({"max_total": "-1"}, "b-max-total-error"),
        ({"max_total": "0"}, "b-max-total-error"),
        ({"max_total": "lots"}, "b-max-total-error"),
        ({"max_total": "1e400"}, "b-max-total-error"),
        ({"max_total": ""}, "b-max-total-error"),
        ({"window": "0"}, "b-window-error"),
        ({"window": "x"}, "b-window-error"),
        ({"name": ""}, "b-name-error"),
        ({"tool": ""}, "b-tool-error"),
        ({"argument": ""}, "b-argument-error"),
        ({"per_args": "a,b,c,d,e"}, "b-per-error"),
    ],
)
def test_a_bad_budget_shows_its_error_and_creates_nothing(
    alice: Person, change: dict[str, str], error_id: str
) -> None:
    before = counts(alice.tenant)
    response = browser(alice).post(reverse("fleet-budget-create"), {**DAILY_STRIPE, **change})
    assert response.status_code == 400
    body = response.content.decode()
    assert re.search(rf'<p class="error" id="{error_id}" role="alert">[^<]+</p>', body), body[-3000:]
    # What was typed is shown again, so it can be corrected.
    assert 'value="daily stripe"' in body or change.get("name") == ""
    assert counts(alice.tenant) == before


def test_a_taken_name_is_a_409_beside_the_name(alice: Person) -> None:
    owner = browser(alice)
    assert owner.post(reverse("fleet-budget-create"), DAILY_STRIPE).status_code == 302
    before = counts(alice.tenant)
    again = owner.post(reverse("fleet-budget-create"), DAILY_STRIPE)
    assert again.status_code == 409 and 'id="b-name-error"' in again.content.decode()
    rate = {"name": "pace", "tool": "*", "max_calls": "many", "window": "1", "window_unit": "min"}
    bad_rate = owner.post(reverse("fleet-rate-limit-create"), rate)
    assert bad_rate.status_code == 400 and 'id="r-max-calls-error"' in bad_rate.content.decode()
    assert counts(alice.tenant) == before


def test_owner_sets_and_deletes_a_rate_limit_and_a_budget(alice: Person) -> None:
    owner = browser(alice)
    rate = {
        "name": "pace",
        "tool": "email.*",
        "max_calls": "2",
        "window": "1",
        "window_unit": "min",
        "per": ["agent"],
    }
    assert owner.post(reverse("fleet-rate-limit-create"), rate).status_code == 302
    with tenant_context(alice.tenant):
        limit = RateLimit.objects.get()
    assert (limit.max_calls, limit.window_s, limit.per) == (2, 60, ["agent"])
    answers = [ask(alice.tenant, n, tool="email.send")["decision"] for n in range(3)]
    assert answers == ["allow", "allow", "deny"]
    body = owner.get(reverse("fleet-controls")).content.decode()
    assert re.search(
        r'data-rate-limit="pace".*?data-scope="agent=billing-bot" data-used="2" data-cap="2"', body, re.S
    )
    assert owner.post(reverse("fleet-rate-limit-delete", args=[limit.pk])).status_code == 302
    assert (
        owner.post(
            reverse("fleet-budget-create"), {**DAILY_STRIPE, "per": ["agent"], "per_args": "currency"}
        ).status_code
        == 302
    )
    with tenant_context(alice.tenant):
        budget = BudgetLimit.objects.get()
        assert not RateLimit.objects.exists()
    assert budget.per == ["agent", "arg:currency"]
    assert owner.post(reverse("fleet-budget-delete", args=[budget.pk])).status_code == 302
    with tenant_context(alice.tenant):
        assert not BudgetLimit.objects.exists()
    events = [r["event"] for r in server_stream(alice.tenant)][-4:]
    assert events == [
        "FLEET_RATE_LIMIT_CREATED",
        "FLEET_RATE_LIMIT_DELETED",
        "FLEET_BUDGET_CREATED",
        "FLEET_BUDGET_DELETED",
    ]


def test_a_third_tenants_page_shows_nothing_of_the_first(alice: Person, carol: Person) -> None:
    budget = in_tenant(
        services.create_budget,
        alice.tenant,
        services.BudgetCreate.parse(
            {"name": "acme-secret-budget", "tool": "acme-secret-tool.*", "max_total": 10, "window_s": 60}
        ),
        actor=named_actor("test"),
    )
    rate = in_tenant(
        services.create_rate_limit,
        alice.tenant,
        services.RateLimitCreate.parse({"name": "acme-secret-pace", "max_calls": 5, "window_s": 60}),
        actor=named_actor("test"),
    )
    halt = in_tenant(
        services.halt,
        alice.tenant,
        services.HaltCreate.parse({"scope": "agent:acme-secret-agent", "reason": "acme-secret-reason"}),
        actor=user_actor("acme-secret-actor"),
    )
    assert ask(alice.tenant, 1, tool="acme-secret-tool.pay", amount=11)["decision"] == "deny"
    outsider = browser(carol)
    for url in (reverse("fleet"), reverse("fleet-controls")):
        body = outsider.get(url).content.decode()
        assert "acme-secret" not in body
        assert 'id="no-budgets"' in body and 'id="no-halts"' in body and 'id="no-denials"' in body
    before = counts(alice.tenant)
    for url in (
        reverse("fleet-budget-delete", args=[budget.pk]),
        reverse("fleet-rate-limit-delete", args=[rate.pk]),
        reverse("fleet-halt-resume", args=[halt.pk]),
    ):
        assert outsider.post(url).status_code == 404
    assert counts(alice.tenant) == before
    with tenant_context(alice.tenant):
        assert GateDecision.objects.filter(reason="budget_exceeded").count() == 1
