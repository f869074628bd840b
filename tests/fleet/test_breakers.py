"""Fleet-wide circuit breakers: opened by the step outcomes agents ship (through the real ingest),
refusing `circuit_open` at the gate, one trial call when half-open, closed by its success and
re-opened by its failure; every transition recorded (history row and audit record, one
transaction); the counts kept in the gate's store (database and Redis alike)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from core.scoping import tenant_context
from fleet import services, tasks
from fleet.gate import GateRequest
from fleet.models import BreakerState, BreakerTransition, CircuitBreaker
from fleet.stores import DatabaseStore, RedisStore
from tenants.actors import named_actor
from tenants.models import Tenant
from tests.hostile.production import OwnRedis, own_redis
from tests.support.chains import Writer, server_stream
from tests.support.scoping import in_statements, in_tenant

SETTINGS: dict[str, Any] = {
    "name": "stripe down",
    "tool": "stripe.*",
    "consecutive_failures": 3,
    "failure_rate": 0.5,
    "min_volume": 10,
    "window_s": 60,
    "cool_down_s": 30,
}


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    with own_redis(tmp_path_factory.mktemp("breaker-redis")) as server:
        yield server


@pytest.fixture(params=["database", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "database":
        chosen: Any = DatabaseStore()
    else:
        server = request.getfixturevalue("private_redis")
        client = redis.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)
        client.flushall()
        chosen = RedisStore(client, services.ledger_since)
    services.set_store(chosen)
    yield chosen
    services.set_store(None)


@pytest.fixture(autouse=True)
def _committing(django_capture_on_commit_callbacks: Any) -> Iterator[None]:
    """After-commit hooks (the breakers' outcome counter) run as each ingest commits (the test's
    transaction never does)."""
    global _capture
    _capture = django_capture_on_commit_callbacks
    yield
    _capture = None


_capture: Any = None


class Agent:
    """One agent's stream, shipping step outcomes through the real ingest."""

    def __init__(self, tenant: Tenant, name: str = "agent-1") -> None:
        self.writer = Writer(tenant, name)
        self.n = 0

    def outcome(
        self, event: str, tool: str = "stripe.charge", saga: str | None = None, step: str = "1"
    ) -> None:
        self.n += 1
        saga = saga or f"s{self.n}"
        fields = {"saga_id": saga, "step_id": step, "tool": tool}
        with _capture(execute=True):
            self.writer.ship(("STEP_INTENT", fields), (event, fields))


def ask(tenant: Tenant, saga: str, tool: str = "stripe.charge", step: str = "1") -> dict[str, Any]:
    request = GateRequest(saga_id=saga, step_id=step, tool=tool, args={})
    return in_statements(services.evaluate, tenant, request, actor=named_actor("test"))


def breaker(tenant: Tenant, **changes: Any) -> CircuitBreaker:
    return in_tenant(
        services.create_breaker,
        tenant,
        services.BreakerCreate.parse({**SETTINGS, **changes}),
        actor=named_actor("test"),
    )


def state(tenant: Tenant, row: CircuitBreaker) -> str:
    with tenant_context(tenant):
        return CircuitBreaker.objects.get(pk=row.pk).state


def cool_down_passes(tenant: Tenant, row: CircuitBreaker) -> None:
    """The breaker's cool-down (or its trial's) is over: its clock moved back, every copy dropped."""
    with tenant_context(tenant):
        earlier = timezone.now() - timedelta(seconds=row.cool_down_s + 1)
        fresh = CircuitBreaker.objects.get(pk=row.pk)
        CircuitBreaker.objects.filter(pk=row.pk).update(
            opened_at=earlier if fresh.opened_at else None, trial_at=earlier if fresh.trial_at else None
        )
    services.forget_policies(tenant)
    from core import epoch

    epoch.bump(tenant.pk)


def history(tenant: Tenant, row: CircuitBreaker) -> list[tuple[str, str]]:
    with tenant_context(tenant):
        return [
            (t.old_state, t.new_state)
            for t in BreakerTransition.objects.filter(breaker=row).order_by("at", "pk")
        ]


def test_consecutive_failures_open_it_and_the_gate_refuses_circuit_open(tenant_a: Tenant, store: Any) -> None:
    row = breaker(tenant_a)
    agent = Agent(tenant_a)
    agent.outcome("STEP_FAILED")
    agent.outcome("STEP_UNKNOWN")
    agent.outcome("STEP_COMMITTED")  # a success breaks the run
    agent.outcome("STEP_FAILED")
    agent.outcome("STEP_FAILED")
    agent.outcome("STEP_FAILED", tool="email.send")  # another tool: not this breaker's
    assert state(tenant_a, row) == BreakerState.CLOSED
    assert ask(tenant_a, "before")["decision"] == "allow"
    agent.outcome("STEP_UNKNOWN", tool="STRIPE.refund")  # matched like halts: any case
    assert state(tenant_a, row) == BreakerState.OPEN
    answer = ask(tenant_a, "after")
    assert answer["decision"] == "deny" and answer["reason"] == "circuit_open"
    assert answer["breaker"] == "stripe down" and 1 <= answer["retry_after"] <= 30
    assert ask(tenant_a, "other", tool="email.send")["decision"] == "allow"
    assert history(tenant_a, row) == [("closed", "open")]
    record = server_stream(tenant_a)[-1]
    assert record["event"] == "FLEET_BREAKER_TRANSITION" and record["actor"] == str(services.BREAKER_ACTOR)
    assert record["old"] == {"state": "closed"} and record["new"] == {"state": "open"}
    assert "3 consecutive failures" in record["reason"]


def test_a_failure_rate_over_the_window_opens_it_only_with_enough_calls(tenant_a: Tenant, store: Any) -> None:
    row = breaker(tenant_a, consecutive_failures=1000, failure_rate=0.5, min_volume=6)
    agent = Agent(tenant_a)
    for event in ["STEP_FAILED", "STEP_COMMITTED"] * 2 + ["STEP_FAILED"]:
        agent.outcome(event)  # 3 of 5 failed: a rate above 0.5, but under min_volume
    assert state(tenant_a, row) == BreakerState.CLOSED
    agent.outcome("STEP_COMMITTED")  # 3 of 6: exactly the rate, with the volume
    assert state(tenant_a, row) == BreakerState.OPEN
    assert "3 of 6 calls failed" in history_reason(tenant_a, row)


def history_reason(tenant: Tenant, row: CircuitBreaker) -> str:
    with tenant_context(tenant):
        return BreakerTransition.objects.filter(breaker=row).latest("at").reason


def test_half_open_lets_one_trial_through_whose_success_closes_it(tenant_a: Tenant, store: Any) -> None:
    row = breaker(tenant_a, consecutive_failures=1)
    agent = Agent(tenant_a)
    agent.outcome("STEP_FAILED")
    assert state(tenant_a, row) == BreakerState.OPEN
    cool_down_passes(tenant_a, row)
    trial = ask(tenant_a, "trial")
    assert trial["decision"] == "allow"
    assert ask(tenant_a, "trial")["decision"] == "allow"  # the trial's own retry
    second = ask(tenant_a, "another")
    assert second["decision"] == "deny" and second["reason"] == "circuit_open"
    assert state(tenant_a, row) == BreakerState.HALF_OPEN
    agent.outcome("STEP_FAILED", saga="not-the-trial")  # in flight from before: not the trial
    assert state(tenant_a, row) == BreakerState.HALF_OPEN
    agent.outcome("STEP_COMMITTED", saga="trial")
    assert state(tenant_a, row) == BreakerState.CLOSED
    assert ask(tenant_a, "after")["decision"] == "allow"
    assert history(tenant_a, row) == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    events = [r for r in server_stream(tenant_a) if r["event"] == "FLEET_BREAKER_TRANSITION"]
    assert [(r["old"]["state"], r["new"]["state"]) for r in events] == history(tenant_a, row)
    # Closed, it counts afresh: the failure before the trial is not carried over.
    agent.outcome("STEP_FAILED")
    assert state(tenant_a, row) == BreakerState.OPEN


def test_a_failed_trial_opens_it_again_and_a_lapsed_trial_lets_another_through(
    tenant_a: Tenant, store: Any
) -> None:
    row = breaker(tenant_a, consecutive_failures=1)
    agent = Agent(tenant_a)
    agent.outcome("STEP_FAILED")
    cool_down_passes(tenant_a, row)
    assert ask(tenant_a, "trial-1")["decision"] == "allow"
    agent.outcome("STEP_UNKNOWN", saga="trial-1")
    assert state(tenant_a, row) == BreakerState.OPEN
    assert ask(tenant_a, "x")["reason"] == "circuit_open"
    cool_down_passes(tenant_a, row)
    assert ask(tenant_a, "trial-2")["decision"] == "allow"
    cool_down_passes(tenant_a, row)  # trial-2's outcome never came
    assert ask(tenant_a, "trial-3")["decision"] == "allow"
    assert ask(tenant_a, "trial-2", step="2")["reason"] == "circuit_open"  # no longer a trial
    agent.outcome("STEP_COMMITTED", saga="trial-3")
    assert state(tenant_a, row) == BreakerState.CLOSED
    assert [new for _, new in history(tenant_a, row)] == [
        "open",
        "half_open",
        "open",
        "half_open",
        "half_open",
        "closed",
    ]


def test_the_fleet_status_carries_an_open_breaker_to_agents(tenant_a: Tenant, store: Any) -> None:
    from fleet.api import _status

    row = breaker(tenant_a, consecutive_failures=1)
    with tenant_context(tenant_a):
        before = _status()
    assert before["breakers"] == []
    Agent(tenant_a).outcome("STEP_FAILED")
    with tenant_context(tenant_a):
        opened = _status()
    assert opened["breakers"] == [{"name": "stripe down", "tool": "stripe.*", "state": "open"}]
    assert opened["version"] != before["version"]
    cool_down_passes(tenant_a, row)
    with tenant_context(tenant_a):
        assert _status()["breakers"][0]["state"] == "half_open"


def test_a_change_of_threshold_counts_afresh_and_is_recorded(tenant_a: Tenant, store: Any) -> None:
    row = breaker(tenant_a, consecutive_failures=2)
    agent = Agent(tenant_a)
    agent.outcome("STEP_FAILED")
    in_tenant(
        services.update_breaker,
        tenant_a,
        row.pk,
        services.BreakerUpdate.parse({"consecutive_failures": 3}),
        actor=named_actor("test"),
    )
    agent.outcome("STEP_FAILED")
    agent.outcome("STEP_FAILED")
    assert state(tenant_a, row) == BreakerState.CLOSED  # the failure before the change is not counted
    agent.outcome("STEP_FAILED")
    assert state(tenant_a, row) == BreakerState.OPEN
    updated = [r for r in server_stream(tenant_a) if r["event"] == "FLEET_BREAKER_UPDATED"]
    assert updated[0]["old"]["consecutive_failures"] == 2 and updated[0]["new"]["consecutive_failures"] == 3


def test_a_tenant_without_breakers_reads_nothing_more_for_its_outcomes(
    tenant_a: Tenant, store: Any, django_assert_num_queries: Any
) -> None:
    from audit.hooks import AppendedRecords
    from audit.queries import StoredRow

    Agent(tenant_a).outcome("STEP_COMMITTED")  # the policies are now held by this process
    row = StoredRow.__new__(StoredRow)
    row.event, row.tool, row.saga_id, row.step_id = "STEP_FAILED", "stripe.charge", "s", "1"
    with django_assert_num_queries(0):
        tasks.outcomes_committed(AppendedRecords(tenant_a, "agent", [(row, {})]))
