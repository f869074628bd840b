"""Reserve, then settle, on both stores: a call asked with `reserve` debits its estimate from every
budget it meets; settling returns the difference once, an actual above the reserve is an overrun
counted against the limit; the ledger (usage, Redis rebuilds) shows reserved, settled and overrun;
a saga's end settles what is left at its reserve; hostile settlements change nothing."""

from __future__ import annotations

import uuid
from typing import Any

from rest_framework.test import APIClient

from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import BudgetLimit, GateDecision
from fleet.stores import LimitStore
from tenants import services as tenant_services
from tenants.actors import named_actor
from tenants.inputs import NewApiKey
from tenants.models import Tenant
from tests.fleet import stores
from tests.hostile.production import OwnRedis
from tests.support.scoping import in_statements, in_tenant

# Both stores, and a private Redis to flush (tests/fleet/stores.py).
store = stores.store
private_redis = stores.private_redis

ACTOR = named_actor("test:reservations")


def _budget(tenant: Tenant, cap: int = 100) -> None:
    in_tenant(
        services.create_budget,
        tenant,
        services.BudgetCreate.parse(
            {"name": "tokens", "tool": "llm.*", "argument": "max_tokens", "max_total": cap, "window_s": 3600}
        ),
        actor=ACTOR,
    )


def reserve(tenant: Tenant, estimate: int, saga: str = "saga-r", **args: Any) -> dict[str, Any]:
    request = GateRequest(
        saga_id=saga,
        step_id=uuid.uuid4().hex,
        tool="llm.complete",
        args=args,
        agent="w",
        reserve=estimate * 10_000,
    )
    return in_statements(services.evaluate, tenant, request, actor=ACTOR)


def ask(tenant: Tenant, amount: float) -> str:
    request = GateRequest(
        saga_id=f"s-{uuid.uuid4()}", step_id="1", tool="llm.complete", args={"max_tokens": amount}, agent="w"
    )
    return str(in_statements(services.evaluate, tenant, request, actor=ACTOR)["decision"])


def usage(tenant: Tenant) -> dict[str, Any]:
    with tenant_context(tenant):
        return services.budget_usage(BudgetLimit.objects.get(name="tokens"))[0]


def settle(tenant: Tenant, answer: dict[str, Any], actual: Any) -> dict[str, Any] | None:
    reservation_id = uuid.UUID(answer["reservation"]["id"])
    settlement = services.GateSettle.parse({"actual": actual})
    return in_tenant(services.settle_reservation, tenant, reservation_id, settlement, actor=ACTOR)


def test_a_reservation_debits_its_estimate_and_settling_returns_the_difference_once(
    tenant_a: Tenant, store: LimitStore
) -> None:
    _budget(tenant_a)
    answer = reserve(tenant_a, 40)  # the call names no max_tokens: the estimate stands for it
    assert answer["decision"] == "allow"
    assert answer["reservation"] == {"id": answer["authorization_id"], "state": "open", "reserved": "40"}
    assert ask(tenant_a, 61) == "deny" and ask(tenant_a, 10) == "allow"
    shown = usage(tenant_a)
    assert (shown["used"], shown["reserved"], shown["settled"], shown["overrun"]) == ("50", "40", "0", "0")
    settled = settle(tenant_a, answer, "12.5")
    assert settled is not None and settled["state"] == "settled"
    assert (settled["actual"], settled["overrun"]) == ("12.5", "0")
    assert settle(tenant_a, answer, 99) == settled  # once: a second settlement changes nothing
    shown = usage(tenant_a)
    assert (shown["used"], shown["reserved"], shown["settled"]) == ("22.5", "0", "12.5")
    assert ask(tenant_a, 77.6) == "deny" and ask(tenant_a, 77.5) == "allow"


def test_an_actual_above_the_reserve_is_an_overrun_counted_against_the_limit(
    tenant_a: Tenant, store: LimitStore
) -> None:
    _budget(tenant_a)
    answer = reserve(tenant_a, 10)
    settled = settle(tenant_a, answer, 25)
    assert settled is not None and (settled["actual"], settled["overrun"]) == ("25", "15")
    shown = usage(tenant_a)
    assert (shown["used"], shown["settled"], shown["overrun"]) == ("25", "25", "15")
    assert ask(tenant_a, 76) == "deny" and ask(tenant_a, 75) == "allow"
    # A reservation beyond what is left is refused like any call, and debits nothing.
    refused = reserve(tenant_a, 1)
    assert refused["decision"] == "deny" and refused["reason"] == "budget_exceeded"


def test_a_saga_end_settles_what_is_left_at_its_reserve(tenant_a: Tenant, store: LimitStore) -> None:
    _budget(tenant_a)
    left = reserve(tenant_a, 30, saga="ends")
    done = reserve(tenant_a, 20, saga="ends")
    other = reserve(tenant_a, 5, saga="runs-on")
    settle(tenant_a, done, 4)
    assert in_tenant(services.settle_saga_reservations, tenant_a, "ends", actor=ACTOR) == 1
    assert in_tenant(services.settle_saga_reservations, tenant_a, "ends", actor=ACTOR) == 0
    with tenant_context(tenant_a):
        row = GateDecision.objects.get(pk=left["authorization_id"])
        assert row.answer()["reservation"]["settled_by"] == "saga_end"
        assert row.answer()["reservation"]["actual"] == "30"
        assert GateDecision.objects.get(pk=other["authorization_id"]).detail["reservation"]["state"] == "open"
    shown = usage(tenant_a)
    assert (shown["used"], shown["reserved"], shown["settled"]) == ("39", "5", "34")
    assert ask(tenant_a, 62) == "deny" and ask(tenant_a, 61) == "allow"


def test_a_flushed_redis_is_rebuilt_with_open_reservations_at_their_reserve_and_settled_at_actual(
    tenant_a: Tenant, private_redis: OwnRedis
) -> None:
    redis_store = stores.redis_store(private_redis)
    services.set_store(redis_store)
    try:
        _budget(tenant_a)
        held = reserve(tenant_a, 30)
        over = reserve(tenant_a, 10)
        under = reserve(tenant_a, 20)
        settle(tenant_a, over, 14)  # overrun 4
        settle(tenant_a, under, 2)
        redis_store.client.flushall()
        # 30 open + 14 + 2 = 46 counted.
        assert ask(tenant_a, 55) == "deny" and ask(tenant_a, 54) == "allow"
        # Settling after the rebuild returns its difference to the rebuilt counters.
        settle(tenant_a, held, 10)
        assert ask(tenant_a, 21) == "deny" and ask(tenant_a, 20) == "allow"
    finally:
        services.set_store(None)


def test_settling_over_http_refuses_hostile_input_and_other_tenants(
    tenant_a: Tenant, tenant_b: Tenant, store: LimitStore
) -> None:
    _budget(tenant_a)
    _, raw = in_tenant(
        tenant_services.create_api_key,
        tenant_a,
        NewApiKey(name="gate", scopes=["gate"]),
        actor=named_actor("test"),
    )
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = {"saga_id": "h", "step_id": "1", "tool": "llm.complete", "args": {}, "agent": "w"}
    for reserve_value in [-1, "NaN", "1e999", 10**12, "ten", True, None, [1]]:
        refused = agent.post("/api/v1/gate/evaluate", {**body, "reserve": reserve_value}, format="json")
        assert refused.status_code == 400 and refused.json()["field"] == "reserve", (
            reserve_value,
            refused.json(),
        )
    answer = agent.post("/api/v1/gate/evaluate", {**body, "reserve": "40"}, format="json").json()
    assert answer["reservation"]["reserved"] == "40"
    path = f"/api/v1/gate/reservations/{answer['authorization_id']}/settle"
    for actual in [-1, "NaN", "Infinity", "1e999", 10**12, "ten", True, None, {}, [1]]:
        refused = agent.post(path, {"actual": actual}, format="json")
        assert refused.status_code == 400 and refused.json()["field"] == "actual", (actual, refused.json())
        assert set(refused.json()) >= {"error", "detail", "field"}
    assert agent.post(path, {}, format="json").json()["field"] == "actual"
    assert agent.post(path, [1], format="json").status_code == 400
    assert usage(tenant_a)["reserved"] == "40"  # nothing changed
    missing = agent.post(f"/api/v1/gate/reservations/{uuid.uuid4()}/settle", {"actual": 1}, format="json")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    plain = agent.post(
        "/api/v1/gate/evaluate", {**body, "step_id": "2", "args": {"max_tokens": 1}}, format="json"
    )
    not_reserved = agent.post(
        f"/api/v1/gate/reservations/{plain.json()['authorization_id']}/settle", {"actual": 0}, format="json"
    )
    assert not_reserved.status_code == 404
    _, other_raw = in_tenant(
        tenant_services.create_api_key,
        tenant_b,
        NewApiKey(name="gate", scopes=["gate"]),
        actor=named_actor("test"),
    )
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_raw}")
    assert other.post(path, {"actual": 0}, format="json").status_code == 404
    assert usage(tenant_a)["reserved"] == "40"
    settled = agent.post(path, {"actual": "41.25"}, format="json")
    assert settled.status_code == 200 and settled.json()["overrun"] == "1.25"
    assert agent.post(path, {"actual": 0}, format="json").json() == settled.json()


def test_a_retry_answers_the_first_reservation_and_a_zero_reserve_is_one(
    tenant_a: Tenant, store: LimitStore
) -> None:
    _budget(tenant_a)
    request = GateRequest(saga_id="x", step_id="1", tool="llm.complete", args={}, agent="w", reserve=0)
    first = in_statements(services.evaluate, tenant_a, request, actor=ACTOR)
    assert (
        in_statements(services.evaluate, tenant_a, request, actor=ACTOR)["reservation"]
        == first["reservation"]
    )
    settled = settle(tenant_a, first, 3)
    assert settled is not None and settled["overrun"] == "3" and usage(tenant_a)["used"] == "3"
    assert in_statements(services.evaluate, tenant_a, request, actor=ACTOR)["reservation"] == settled
