"""Budget leases on both stores: spent + every outstanding lease never exceeds a cap, a lease takes
at most a share of what is left (little left: per call), a give-back returns the unused units
once, the ledger (usage, fleet spend, Redis rebuilds) counts outstanding leases whole and
returned ones as used, and what a per-call decision could answer differently is never leased."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import BudgetLimit, GateLease
from fleet.stores import LimitStore
from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Tenant
from tests.fleet import stores
from tests.hostile.production import OwnRedis
from tests.support.factories import Person
from tests.support.scoping import in_statements, in_tenant

ACTOR = named_actor("test:leases")


# Both stores, and a private Redis to flush (tests/fleet/stores.py).
store = stores.store
private_redis = stores.private_redis


def call(tool: str = "llm.complete", saga: str = "saga-1", **args: Any) -> GateRequest:
    return GateRequest(saga_id=saga, step_id="s", tool=tool, args=args, agent="writer")


def lease(tenant: Tenant, calls: int, **args: Any) -> dict[str, Any]:
    return in_tenant(
        services.grant_lease, tenant, call(**args), calls=calls, lease_id=uuid.uuid4(), actor=ACTOR
    )


def ask(tenant: Tenant, **args: Any) -> str:
    request = GateRequest(saga_id=f"s-{uuid.uuid4()}", step_id="1", tool="llm.complete", args=args, agent="w")
    return str(in_statements(services.evaluate, tenant, request, actor=ACTOR)["decision"])


def used_of(tenant: Tenant, name: str = "tokens") -> list[dict[str, Any]]:
    with tenant_context(tenant):
        return services.budget_usage(BudgetLimit.objects.get(name=name))


def test_a_lease_takes_a_share_of_what_is_left_and_counts_whole_until_returned(
    tenant_a: Tenant, store: LimitStore
) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    first = lease(tenant_a, 50, amount=2)
    assert first["decision"] == "lease" and first["limits"][0]["granted"] == "24"  # 100 / 4, in whole calls
    assert first["limits"][0]["per_call"] == "2" and first["limits"][0]["argument"] == "amount"
    second = lease(tenant_a, 5, amount=2)
    assert second["limits"][0]["granted"] == "10"  # what it asked for: within 76 / 4
    # 34 leased: a per-call decision sees only 66 left.
    assert ask(tenant_a, amount=67) == "deny" and ask(tenant_a, amount=66) == "allow"
    assert used_of(tenant_a)[0]["used"] == "100" and used_of(tenant_a)[0]["leased"] == "34"
    # Given back with 4 used: 20 return to the budget, once.
    returned = in_tenant(
        services.give_back_lease, tenant_a, uuid.UUID(first["lease_id"]), {"tokens": 4}, actor=ACTOR
    )
    assert returned is not None and returned["state"] == "returned" and returned["used"] == {"tokens": "4"}
    again = in_tenant(
        services.give_back_lease, tenant_a, uuid.UUID(first["lease_id"]), {"tokens": 0}, actor=ACTOR
    )
    assert again == returned
    assert ask(tenant_a, amount=21) == "deny" and ask(tenant_a, amount=20) == "allow"
    usage = used_of(tenant_a)[0]
    assert usage["used"] == "100" and usage["leased"] == "10"
    with tenant_context(tenant_a):
        units, agents = services.spend_since(timezone.now() - timedelta(hours=1))
    assert units == 100 * 10_000 and agents == 2  # the leases' agent and the per-call one


def test_little_left_is_decided_per_call_so_a_small_cap_stays_exact(
    tenant_a: Tenant, store: LimitStore
) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 10, "window_s": 3600}),
        actor=ACTOR,
    )
    granted = Decimal(0)
    answers = []
    for _ in range(16):  # sixteen agents each asking for a lease of ten calls of one unit
        answer = lease(tenant_a, 10, amount=1)
        answers.append(answer["decision"])
        if answer["decision"] == "lease":
            granted += Decimal(answer["limits"][0]["granted"])
    assert answers[0] == "lease" and answers[-1] == "per_call"
    assert granted < 10
    # Per call, every unit not leased is usable, and not one more.
    allowed = sum(ask(tenant_a, amount=1) == "allow" for _ in range(12))
    assert allowed == 10 - granted


def test_what_a_per_call_decision_could_answer_differently_is_never_leased(
    tenant_a: Tenant, store: LimitStore
) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    assert lease(tenant_a, 1, tool="other.x", amount=1)["reason"] == "ungoverned"
    assert lease(tenant_a, 1)["reason"] == "invalid_argument"  # no amount to count
    in_tenant(
        services.create_rate_limit,
        tenant_a,
        services.RateLimitCreate.parse({"name": "rpm", "tool": "llm.chat", "max_calls": 5, "window_s": 60}),
        actor=ACTOR,
    )
    assert lease(tenant_a, 1, tool="llm.chat", amount=1)["reason"] == "rate_limited_per_call"
    in_tenant(
        services.quarantine,
        tenant_a,
        "saga-q",
        services.QuarantineCreate.parse({"reason": "odd", "preemptive": True}),
        actor=ACTOR,
    )
    assert (
        in_tenant(
            services.grant_lease,
            tenant_a,
            call(saga="saga-q", amount=1),
            calls=1,
            lease_id=uuid.uuid4(),
            actor=ACTOR,
        )["reason"]
        == "quarantined"
    )
    in_tenant(
        services.halt,
        tenant_a,
        services.HaltCreate.parse({"scope": "tool:llm.*", "reason": "stop"}),
        actor=ACTOR,
    )
    assert lease(tenant_a, 1, amount=1)["reason"] == "halted"
    with tenant_context(tenant_a):
        assert not GateLease.objects.exists()


def test_a_retried_grant_answers_the_first_and_debits_once(tenant_a: Tenant, store: LimitStore) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    lease_id = uuid.uuid4()
    first = in_tenant(services.grant_lease, tenant_a, call(amount=1), calls=4, lease_id=lease_id, actor=ACTOR)
    again = in_tenant(services.grant_lease, tenant_a, call(amount=1), calls=4, lease_id=lease_id, actor=ACTOR)
    assert first == again and first["limits"][0]["granted"] == "4"
    assert ask(tenant_a, amount=96) == "allow" and ask(tenant_a, amount=1) == "deny"


def test_a_flushed_redis_is_rebuilt_with_outstanding_leases_whole_and_returned_ones_as_used(
    tenant_a: Tenant, private_redis: OwnRedis
) -> None:
    store = stores.redis_store(private_redis)
    services.set_store(store)
    try:
        in_tenant(
            services.create_budget,
            tenant_a,
            services.BudgetCreate.parse(
                {"name": "tokens", "tool": "llm.*", "max_total": 100, "window_s": 3600}
            ),
            actor=ACTOR,
        )
        held = lease(tenant_a, 20, amount=1)  # 20 outstanding
        given = lease(tenant_a, 20, amount=1)  # 20, of which 3 used
        in_tenant(
            services.give_back_lease, tenant_a, uuid.UUID(given["lease_id"]), {"tokens": 3}, actor=ACTOR
        )
        assert held["limits"][0]["granted"] == "20"
        store.client.flushall()
        assert ask(tenant_a, amount=78) == "deny" and ask(tenant_a, amount=77) == "allow"
        # A give-back after the rebuild returns its unused units to the rebuilt counters.
        in_tenant(services.give_back_lease, tenant_a, uuid.UUID(held["lease_id"]), {"tokens": 5}, actor=ACTOR)
        assert ask(tenant_a, amount=16) == "deny" and ask(tenant_a, amount=15) == "allow"
    finally:
        services.set_store(None)


def test_leases_over_http(tenant_a: Tenant, store: LimitStore) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse(
            {"name": "tokens", "tool": "llm.*", "max_total": 100, "window_s": 3600, "per": ["arg:model"]}
        ),
        actor=ACTOR,
    )
    _, raw = in_tenant(
        tenant_services.create_api_key,
        tenant_a,
        NewApiKey(name="gate", scopes=["gate"]),
        actor=named_actor("test"),
    )
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = {"saga_id": "s1", "tool": "llm.complete", "args": {"amount": 1, "model": "m"}, "agent": "w"}
    first = agent.post(
        "/api/v1/gate/leases", {**body, "lease_id": str(uuid.uuid4()), "calls": 8}, format="json"
    )
    assert first.status_code == 200, first.json()
    answer = first.json()
    assert answer["decision"] == "lease" and answer["ttl_ms"] == 1000 and answer["scope_args"] == ["model"]
    renewed = agent.post(
        "/api/v1/gate/leases",
        {
            **body,
            "lease_id": str(uuid.uuid4()),
            "calls": 8,
            "returns": {"lease_id": answer["lease_id"], "used": {"tokens": "2"}},
        },
        format="json",
    )
    assert renewed.status_code == 200, renewed.json()
    assert renewed.json()["returned"]["used"] == {"tokens": "2"}
    back = agent.post(f"/api/v1/gate/leases/{renewed.json()['lease_id']}/return", {"used": {}}, format="json")
    assert back.status_code == 200 and back.json()["used"] == {"tokens": "0"}
    for payload, field in [
        ({**body, "lease_id": "nope", "calls": 1}, "lease_id"),
        ({**body, "lease_id": str(uuid.uuid4()), "calls": 0}, "calls"),
        ({**body, "lease_id": str(uuid.uuid4()), "calls": True}, "calls"),
        (
            {**body, "lease_id": str(uuid.uuid4()), "calls": 1, "returns": {"lease_id": "x"}},
            "returns.lease_id",
        ),
    ]:
        refused = agent.post("/api/v1/gate/leases", payload, format="json")
        assert refused.status_code == 400 and refused.json()["field"] == field, refused.json()
    # A return answers the first once given back; an outstanding lease refuses a limit it lacks.
    again = agent.post(
        f"/api/v1/gate/leases/{answer['lease_id']}/return", {"used": {"nope": 1}}, format="json"
    )
    assert again.status_code == 200 and again.json()["used"] == {"tokens": "2"}
    fresh = agent.post(
        "/api/v1/gate/leases", {**body, "lease_id": str(uuid.uuid4()), "calls": 1}, format="json"
    )
    unknown = agent.post(
        f"/api/v1/gate/leases/{fresh.json()['lease_id']}/return", {"used": {"nope": 1}}, format="json"
    )
    assert unknown.status_code == 400 and unknown.json()["field"] == "body.used", unknown.json()
    missing = agent.post(f"/api/v1/gate/leases/{uuid.uuid4()}/return", {}, format="json")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert agent.post("/api/v1/gate/leases/nope/return", {}, format="json").status_code == 404


def _gauge_of(owner: Client, budget: str) -> str:
    page = owner.get(reverse("fleet")).content.decode()
    return page.split(f'data-budget="{budget}"', 1)[1].split('class="limit"', 1)[0]


def test_the_fleet_page_shows_what_of_a_budget_is_leased(alice: Person, store: LimitStore) -> None:
    in_tenant(
        services.create_budget,
        alice.tenant,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    held = lease(alice.tenant, 5, amount=2)
    owner = Client()
    owner.force_login(alice.user)
    gauge = _gauge_of(owner, "tokens")
    assert 'data-used="10"' in gauge and "of it 10 leased" in gauge
    in_tenant(services.give_back_lease, alice.tenant, uuid.UUID(held["lease_id"]), {"tokens": 4}, actor=ACTOR)
    gauge = _gauge_of(owner, "tokens")
    assert 'data-used="4"' in gauge and "leased" not in gauge


def test_more_used_than_granted_is_an_overrun_recorded_and_counted(
    tenant_a: Tenant, store: LimitStore
) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "tokens", "tool": "llm.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    held = lease(tenant_a, 4, amount=1)
    assert held["limits"][0]["granted"] == "4"
    settled = in_tenant(
        services.give_back_lease, tenant_a, uuid.UUID(held["lease_id"]), {"tokens": "6.5"}, actor=ACTOR
    )
    assert (
        settled is not None
        and settled["used"] == {"tokens": "6.5"}
        and settled["overrun"] == {"tokens": "2.5"}
    )
    # Counted against the budget where the next decision reads, and in the ledger.
    assert ask(tenant_a, amount=94) == "deny" and ask(tenant_a, amount=93.5) == "allow"
    assert used_of(tenant_a)[0]["used"] == "100"
