"""The gate's answers, on both stores: all-or-nothing debits, idempotent allows, refusals that debit
nothing, bad arguments refused, halts and quarantines, tenants apart, and Redis lost → refusal."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis

from core import availability
from core.errors import DomainError
from core.scoping import tenant_context
from fleet import services
from fleet.gate import GateRequest
from fleet.models import Decision, GateDecision, LimitCounter
from fleet.stores import DatabaseStore, LimitStore, RedisStore, marker_key
from tenants.actors import named_actor, user_actor
from tenants.models import Tenant
from tests.hostile.production import OwnRedis, own_redis
from tests.support.scoping import in_statements, in_tenant

ACTOR = named_actor("test:gate")


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    with own_redis(tmp_path_factory.mktemp("gate-redis")) as server:
        yield server


# Half of production's fence keeps a rebuild short; its commit deadline (half the fence) must
# still outlast a busy machine's pause between the Redis debit and the ledger commit, or the
# call is refused as late (limit_store_unavailable) and the test reads load, not the gate.
def _redis_store(server: OwnRedis, *, fence_ms: int = 1000) -> RedisStore:
    client = redis.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)
    client.flushall()  # our own server: tenant ids may repeat between tests on SQLite
    store = RedisStore(client, services.ledger_since)
    store.fence_ms = fence_ms
    store.commit_deadline_ms = fence_ms // 2
    return store


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LimitStore:
    if request.param == "database":
        return DatabaseStore()
    return _redis_store(request.getfixturevalue("private_redis"))


_calls = iter(range(10**9))


def call(tool: str = "stripe.charge", saga: str | None = None, **args: Any) -> GateRequest:
    n = next(_calls)
    return GateRequest(
        saga_id=saga or f"saga-{n}",
        step_id=f"step-{n}",
        tool=tool,
        args=args,
        agent="billing-bot",
        api_key_prefix="",
    )


def ask(tenant: Tenant, store: LimitStore, request: GateRequest) -> dict[str, Any]:
    return in_statements(services.evaluate, tenant, request, actor=ACTOR, store=store)


def allowed_total(tenant: Tenant) -> int:
    with tenant_context(tenant):
        return sum(
            int(d["amount"])
            for debits in GateDecision.objects.filter(decision=Decision.ALLOW).values_list(
                "debits", flat=True
            )
            for d in debits
            if d["kind"] == "budget"
        )


def test_a_budget_allows_up_to_its_cap_and_refuses_past_it(tenant_a: Tenant, store: LimitStore) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse(
            {"name": "daily", "tool": "stripe.*", "max_total": 50_000, "window_s": 86400}
        ),
        actor=ACTOR,
    )
    answers = [ask(tenant_a, store, call(amount=999)) for _ in range(51)]
    assert [a["decision"] for a in answers] == ["allow"] * 50 + ["deny"]
    refusal = answers[-1]
    assert refusal["reason"] == "budget_exceeded" and refusal["limit"] == "daily"
    assert Decimal(refusal["remaining"]) == 50_000 - 50 * 999 and refusal["retry_after"] > 0
    # What remains still serves a call that fits.
    assert ask(tenant_a, store, call(amount=50))["decision"] == "allow"
    assert allowed_total(tenant_a) == (50 * 999 + 50) * 10_000


def test_a_call_refused_by_its_third_limit_debits_none(tenant_a: Tenant, store: LimitStore) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "all", "tool": "*", "max_total": 1000, "window_s": 3600}),
        actor=ACTOR,
    )
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse(
            {"name": "stripe", "tool": "stripe.*", "max_total": 1000, "window_s": 3600}
        ),
        actor=ACTOR,
    )
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse(
            {
                "name": "per-customer",
                "tool": "stripe.*",
                "max_total": 100,
                "window_s": 3600,
                "per": ["arg:customer"],
            }
        ),
        actor=ACTOR,
    )
    refused = ask(tenant_a, store, call(amount=150, customer="c1"))
    assert refused["decision"] == "deny" and refused["limit"] == "per-customer"
    # Nothing was debited by the first two: 1000 still fits in "all" and "stripe" (another customer).
    assert ask(tenant_a, store, call(amount=100, customer="c2"))["decision"] == "allow"
    assert ask(tenant_a, store, call(tool="crm.insert", amount=900))["decision"] == "allow"
    assert ask(tenant_a, store, call(tool="crm.insert", amount=1))["reason"] == "budget_exceeded"
    assert allowed_total(tenant_a) == (100 * 3 + 900) * 10_000  # "all", "stripe", "per-customer" + "all"


def test_a_retried_call_gets_the_same_authorisation_and_debits_once(
    tenant_a: Tenant, store: LimitStore
) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    request = call(amount=60)
    first, second = ask(tenant_a, store, request), ask(tenant_a, store, request)
    assert first["decision"] == "allow" and first == second
    assert ask(tenant_a, store, call(amount=40))["decision"] == "allow"  # 60 + 40: debited once
    with tenant_context(tenant_a):
        assert GateDecision.objects.filter(decision=Decision.ALLOW).count() == 2


@pytest.mark.parametrize(
    "bad", [-1, float("nan"), float("inf"), float("-inf"), True, "100", None, 10**30, [5], {"v": 5}]
)
def test_an_argument_that_cannot_be_counted_is_refused_and_debits_nothing(
    tenant_a: Tenant, store: LimitStore, bad: Any
) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    answer = ask(tenant_a, store, call(amount=bad))
    assert (
        answer["decision"] == "deny"
        and answer["reason"] == "invalid_argument"
        and answer["argument"] == "amount"
    )
    missing = ask(tenant_a, store, call(other=5))
    assert missing["decision"] == "deny" and missing["reason"] == "invalid_argument"
    assert allowed_total(tenant_a) == 0
    assert ask(tenant_a, store, call(amount=100))["decision"] == "allow"  # the whole cap is still there


def test_an_ungoverned_tool_passes_and_debits_nothing(tenant_a: Tenant, store: LimitStore) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "stripe.*", "max_total": 1, "window_s": 3600}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(tool="crm.insert", amount=10**6))["decision"] == "allow"
    assert ask(tenant_a, store, call(tool="crm.insert"))["decision"] == "allow"  # no amount needed
    assert allowed_total(tenant_a) == 0


def test_a_rate_limit_allows_its_calls_then_refuses_with_a_retry_after(
    tenant_a: Tenant, store: LimitStore
) -> None:
    in_tenant(
        services.create_rate_limit,
        tenant_a,
        services.RateLimitCreate.parse(
            {"name": "5/min", "tool": "email.*", "max_calls": 5, "window_s": 60, "per": ["agent"]}
        ),
        actor=ACTOR,
    )
    answers = [ask(tenant_a, store, call(tool="email.send")) for _ in range(6)]
    assert [a["decision"] for a in answers] == ["allow"] * 5 + ["deny"]
    assert answers[-1]["reason"] == "rate_limited" and 1 <= answers[-1]["retry_after"] <= 12
    assert ask(tenant_a, store, call(tool="stripe.charge", amount=1))["decision"] == "allow"


def test_halts_stop_matching_calls_until_resumed(tenant_a: Tenant, store: LimitStore) -> None:
    halt = in_tenant(
        services.halt,
        tenant_a,
        services.HaltCreate.parse({"scope": "tool:stripe.*", "reason": "incident 42"}),
        actor=ACTOR,
    )
    refused = ask(tenant_a, store, call(tool="stripe.charge", amount=1))
    assert (
        refused["decision"] == "deny"
        and refused["reason"] == "halted"
        and refused["scope"] == "tool:stripe.*"
    )
    assert ask(tenant_a, store, call(tool="crm.insert"))["decision"] == "allow"
    in_tenant(services.resume, tenant_a, halt.pk, actor=ACTOR)
    assert ask(tenant_a, store, call(tool="stripe.charge", amount=1))["decision"] == "allow"


def test_a_halt_with_a_ttl_lapses_by_itself(tenant_a: Tenant, store: LimitStore) -> None:
    halt = in_tenant(
        services.halt,
        tenant_a,
        services.HaltCreate.parse({"scope": "*", "reason": "maintenance", "ttl_s": 60}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(tool="x"))["reason"] == "halted"
    with tenant_context(tenant_a):
        type(halt).objects.filter(pk=halt.pk).update(expires_at=halt.created_at)  # its hour has passed
    services.forget_policies(tenant_a)  # a row edited behind the services' back: re-read it now
    assert ask(tenant_a, store, call(tool="x"))["decision"] == "allow"


def test_drain_lets_a_running_saga_finish_and_refuses_a_new_one(tenant_a: Tenant, store: LimitStore) -> None:
    assert ask(tenant_a, store, call(tool="crm.insert", saga="running"))["decision"] == "allow"
    in_tenant(
        services.halt,
        tenant_a,
        services.HaltCreate.parse({"scope": "*", "mode": "drain", "reason": "deploy"}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(tool="crm.update", saga="running"))["decision"] == "allow"
    refused = ask(tenant_a, store, call(tool="crm.insert", saga="new"))
    assert refused["decision"] == "deny" and refused["reason"] == "draining"


def test_a_quarantined_saga_is_refused(tenant_a: Tenant, store: LimitStore) -> None:
    in_tenant(
        services.quarantine,
        tenant_a,
        "suspect",
        services.QuarantineCreate.parse({"reason": "looping", "preemptive": True}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(tool="crm.insert", saga="suspect"))["reason"] == "quarantined"
    assert ask(tenant_a, store, call(tool="crm.insert", saga="other"))["decision"] == "allow"


def test_another_tenants_policies_and_halts_never_touch_this_one(
    tenant_a: Tenant, tenant_b: Tenant, store: LimitStore
) -> None:
    in_tenant(
        services.create_budget,
        tenant_b,
        services.BudgetCreate.parse({"name": "tiny", "tool": "*", "max_total": 1, "window_s": 3600}),
        actor=ACTOR,
    )
    in_tenant(
        services.halt,
        tenant_b,
        services.HaltCreate.parse({"scope": "tool:crm.*", "reason": "b's incident"}),
        actor=ACTOR,
    )
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "tiny", "tool": "*", "max_total": 1, "window_s": 3600}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(tool="crm.insert", amount=1))["decision"] == "allow"
    assert ask(tenant_b, store, call(tool="stripe.charge", amount=1))["decision"] == "allow"  # b's own budget
    assert ask(tenant_b, store, call(tool="stripe.charge", amount=1))["reason"] == "budget_exceeded"
    assert (
        ask(tenant_a, store, call(tool="stripe.charge", amount=1))["reason"] == "budget_exceeded"
    )  # a's own


def test_policy_changes_are_in_the_server_stream(tenant_a: Tenant) -> None:
    from tests.support.chains import server_stream

    budget = in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "daily", "max_total": "50000", "window_s": 86400}),
        actor=user_actor("alice"),
    )
    halt = in_tenant(
        services.halt,
        tenant_a,
        services.HaltCreate.parse({"scope": "tool:email.*", "reason": "spam", "ttl_s": 600}),
        actor=user_actor("alice"),
    )
    in_tenant(services.resume, tenant_a, halt.pk, actor=user_actor("bob"))
    assert (
        in_tenant(services.resume, tenant_a, halt.pk, actor=user_actor("bob")) is None
    )  # a no-op records nothing
    in_tenant(services.delete_budget, tenant_a, budget.pk, actor=user_actor("alice"))
    events = [(r["event"], r["actor"], r["old"], r["new"]) for r in server_stream(tenant_a)[-4:]]
    assert events[0][0:3] == ("FLEET_BUDGET_CREATED", "user:alice", None)
    assert events[0][3]["max_total"] == "50000"
    assert (
        events[1][0:3] == ("KILLSWITCH_ENGAGED", "user:alice", None)
        and events[1][3]["scope"] == "tool:email.*"
    )
    assert events[2] == ("KILLSWITCH_RELEASED", "user:bob", {"in_force": True}, {"in_force": False})
    assert events[3][0] == "FLEET_BUDGET_DELETED" and events[3][3] is None and events[3][2]["name"] == "daily"


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "", "max_total": 1, "window_s": 60},
        {"name": "x", "max_total": 0, "window_s": 60},
        {"name": "x", "max_total": float("nan"), "window_s": 60},
        {"name": "x", "max_total": 10**30, "window_s": 60},
        {"name": "x", "max_total": 1, "window_s": 0},
        {"name": "x", "max_total": 1, "window_s": True},
        {"name": "x", "max_total": 1, "window_s": 60, "per": ["customer"]},
        {"name": "x", "max_total": 1, "window_s": 60, "on_cap": "shrug"},
        {"name": "x\x00y", "max_total": 1, "window_s": 60},
    ],
)
def test_a_malformed_budget_is_refused_naming_its_field(tenant_a: Tenant, fields: dict[str, Any]) -> None:
    with pytest.raises(DomainError) as refused:
        in_tenant(services.create_budget, tenant_a, services.BudgetCreate.parse({**fields}), actor=ACTOR)
    assert refused.value.field in fields


# ------------------------------------------------------------------------------------ Redis faults


def test_redis_unreachable_refuses_every_call(tenant_a: Tenant, tmp_path: Path) -> None:
    with own_redis(tmp_path) as server:
        store = _redis_store(server)
        in_tenant(
            services.create_budget,
            tenant_a,
            services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 3600}),
            actor=ACTOR,
        )
        assert ask(tenant_a, store, call(amount=1))["decision"] == "allow"
        server.kill()
        for request in [call(amount=1), call(tool="crm.insert", amount=1), call(amount=10**6)]:
            with pytest.raises(availability.Unavailable) as refused:
                ask(tenant_a, store, request)
            body = refused.value.body()
            assert refused.value.status == 503 and body["error"] == "control_plane_unavailable"
            assert body["decision"] == "deny" and body["reason"] == "control_plane_unavailable"
        assert availability.is_down(availability.REDIS)
    assert allowed_total(tenant_a) == 1 * 10_000


def test_a_redis_back_empty_is_made_ready_for_every_tenant_behind_one_fence(
    tenant_a: Tenant, tenant_b: Tenant, private_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the availability probe runs before it lets calls through again (RedisStore.make_ready):
    every tenant's counters rebuilt from the ledger, and the fence waited once, not per tenant."""
    store = _redis_store(private_redis)
    for tenant in (tenant_a, tenant_b):
        in_tenant(
            services.create_budget,
            tenant,
            services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 3600}),
            actor=ACTOR,
        )
        assert ask(tenant, store, call(amount=60))["decision"] == "allow"
    store.client.flushall()  # back empty, as after a crash
    import fleet.stores

    fences: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(fleet.stores.time, "sleep", lambda s: (fences.append(s), real_sleep(s)))
    tenants = [(tenant.pk, services.gate_tag(tenant)) for tenant in (tenant_a, tenant_b)]
    store.make_ready(tenants)
    assert fences == [store.fence_ms / 1000]
    monkeypatch.undo()
    for tenant in (tenant_a, tenant_b):
        assert store.client.exists(marker_key(services.gate_tag(tenant)))
        assert ask(tenant, store, call(amount=41))["reason"] == "budget_exceeded"  # 60 counted
        assert ask(tenant, store, call(amount=40))["decision"] == "allow"


def test_a_flushed_redis_is_rebuilt_from_the_ledger_without_resetting_any_window(
    tenant_a: Tenant, private_redis: OwnRedis
) -> None:
    store = _redis_store(private_redis)
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "stripe.*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    in_tenant(
        services.create_rate_limit,
        tenant_a,
        services.RateLimitCreate.parse({"name": "3/h", "tool": "email.*", "max_calls": 3, "window_s": 3600}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(amount=70))["decision"] == "allow"
    assert all(ask(tenant_a, store, call(tool="email.send"))["decision"] == "allow" for _ in range(3))
    retried = call(amount=20)
    first = ask(tenant_a, store, retried)
    store.client.flushall()
    assert not store.client.exists(marker_key(services.gate_tag(tenant_a)))
    # Rebuilt before anything is allowed: 90 of 100 spent, the three calls counted, the retry known.
    assert ask(tenant_a, store, call(amount=11))["reason"] == "budget_exceeded"
    assert ask(tenant_a, store, call(tool="email.send"))["reason"] == "rate_limited"
    assert ask(tenant_a, store, retried) == first
    assert ask(tenant_a, store, call(amount=10))["decision"] == "allow"
    assert store.client.exists(marker_key(services.gate_tag(tenant_a)))


def test_the_database_store_keeps_counters_in_the_tenants_rows(tenant_a: Tenant, tenant_b: Tenant) -> None:
    store = DatabaseStore()
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(amount=5))["decision"] == "allow"
    with tenant_context(tenant_b):
        assert not LimitCounter.objects.exists()
    with tenant_context(tenant_a):
        assert sum(LimitCounter.objects.values_list("amount", flat=True)) == 5 * 10_000


def test_retry_after_says_when_the_window_frees_enough(tenant_a: Tenant, store: LimitStore) -> None:
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 600}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(amount=100))["decision"] == "allow"
    refused = ask(tenant_a, store, call(amount=1))
    # The only debit leaves the window after 600 s plus at most one bucket (10 s).
    assert 590 <= refused["retry_after"] <= 600 + math.ceil(600 / 60) + 1
    assert ask(tenant_a, store, call(amount=101))["retry_after"] is None  # never fits


def test_old_denials_are_pruned_and_allows_never(tenant_a: Tenant) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from fleet.tasks import prune_old_rows

    store = DatabaseStore()
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 1, "window_s": 60}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(amount=1))["decision"] == "allow"
    assert ask(tenant_a, store, call(amount=1))["decision"] == "deny"
    assert ask(tenant_a, store, call(amount=1))["decision"] == "deny"
    with tenant_context(tenant_a):
        old = timezone.now() - services.DENIALS_KEPT_FOR - timedelta(minutes=1)
        GateDecision.objects.all().update(decided_at=old)
        assert ask(tenant_a, store, call(amount=-1))["decision"] == "deny"  # a recent one stays
    assert prune_old_rows() == {"denials": 2, "lease_uses": 0}
    with tenant_context(tenant_a):
        assert list(GateDecision.objects.values_list("decision", flat=True).order_by("decision")) == [
            "allow",
            "deny",
        ]


def test_denials_are_pruned_a_bounded_batch_at_a_time_oldest_first(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from fleet.tasks import prune_denials_of

    store = DatabaseStore()
    for tenant in (tenant_a, tenant_b):
        in_tenant(
            services.create_budget,
            tenant,
            services.BudgetCreate.parse({"name": "none", "tool": "*", "max_total": 1, "window_s": 60}),
            actor=ACTOR,
        )
        for _ in range(5):
            assert ask(tenant, store, call(amount=2))["decision"] == "deny"
        with tenant_context(tenant):
            old = timezone.now() - services.DENIALS_KEPT_FOR - timedelta(minutes=1)
            for age, pk in enumerate(
                GateDecision.objects.order_by("decided_at").values_list("pk", flat=True)
            ):
                GateDecision.objects.filter(pk=pk).update(decided_at=old - timedelta(minutes=5 - age))
    now = timezone.now()
    with tenant_context(tenant_a):
        newest = list(GateDecision.objects.order_by("decided_at").values_list("pk", flat=True))[-1]
    assert in_tenant(services.prune_denials, tenant_a, now=now, limit=2) == 2  # one call, one batch
    assert prune_denials_of(tenant_a, now=now, batch=1, batches=2) == 2  # a pass stops at its bound
    with tenant_context(tenant_a):
        assert list(GateDecision.objects.values_list("pk", flat=True)) == [newest]  # oldest went first
    with tenant_context(tenant_b):
        assert GateDecision.objects.count() == 5  # another tenant's pass; none of b's went


def test_a_retry_whose_redis_key_is_gone_still_gets_the_first_allow(
    tenant_a: Tenant, private_redis: OwnRedis
) -> None:
    store = _redis_store(private_redis)
    in_tenant(
        services.create_budget,
        tenant_a,
        services.BudgetCreate.parse({"name": "cap", "tool": "*", "max_total": 100, "window_s": 3600}),
        actor=ACTOR,
    )
    request = call(amount=30)
    first = ask(tenant_a, store, request)
    for key in store.client.scan_iter(match="*:idem:*"):
        store.client.delete(key)  # expired after its week, say
    assert ask(tenant_a, store, request) == first  # the ledger's unique allow stands
    with tenant_context(tenant_a):
        assert GateDecision.objects.filter(decision=Decision.ALLOW).count() == 1


def test_a_policy_change_reaches_the_next_call_at_once(tenant_a: Tenant, store: LimitStore) -> None:
    assert ask(tenant_a, store, call(tool="crm.insert"))["decision"] == "allow"  # policies now held
    in_tenant(
        services.create_rate_limit,
        tenant_a,
        services.RateLimitCreate.parse({"name": "1/h", "tool": "crm.*", "max_calls": 1, "window_s": 3600}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(tool="crm.insert"))["decision"] == "allow"
    assert ask(tenant_a, store, call(tool="crm.insert"))["reason"] == "rate_limited"
    in_tenant(
        services.quarantine,
        tenant_a,
        "held",
        services.QuarantineCreate.parse({"reason": "r", "preemptive": True}),
        actor=ACTOR,
    )
    assert ask(tenant_a, store, call(tool="x", saga="held"))["reason"] == "quarantined"
